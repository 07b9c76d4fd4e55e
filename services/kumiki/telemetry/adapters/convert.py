"""Protobuf messages ↔ the core's values: the only place that knows both."""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.telemetry.core import (
    Assignment,
    GpuFinding,
    IdleFinding,
    Inventory,
    InventoryGpu,
    NodeView,
    Reading,
    Transition,
)

_new_tuple = tuple.__new__


def timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    whole = math.floor(seconds)  # split first: seconds * 1e9 in a double loses the nanoseconds
    stamp.FromNanoseconds(whole * 1_000_000_000 + round((seconds - whole) * 1e9))
    return stamp


def reading_from_sample(sample: events_pb2.GpuSample) -> Reading:
    """Called for every sample: the tuple is built without the NamedTuple's Python-level __new__."""
    has = sample.HasField
    stamp = sample.sampled_at
    xids = sample.xid_errors
    return _new_tuple(
        Reading,
        (
            sample.node,
            sample.gpu_uuid,
            sample.gpu_index,
            sample.mig_instance_id if has("mig_instance_id") else None,
            stamp.seconds + stamp.nanos / 1e9,  # grpcutil.unix_seconds, inlined on this per-sample path
            sample.gpu_utilization_pct if has("gpu_utilization_pct") else None,
            sample.memory_used_mib if has("memory_used_mib") else None,
            sample.memory_total_mib if has("memory_total_mib") else None,
            sample.ecc_uncorrected if has("ecc_uncorrected") else None,
            tuple(xids) if xids else (),
            sample.gpu_model,
        ),
    )


def inventory_from_state(state: events_pb2.NodeState) -> Inventory:
    return Inventory(
        node=state.node,
        gpus=tuple(
            InventoryGpu(
                gpu.index,
                gpu.uuid,
                gpu.model,
                gpu.memory_mib,
                gpu.nvlink_island,
                gpu.mig_enabled,
                tuple(gpu.mig_slices),
                gpu.shareable,
            )
            for gpu in state.gpus
        ),
        cpu_milli=state.cpu_milli,
        memory_mib=state.memory_mib,
        rack=state.rack,
        labels=dict(state.labels),
    )


def transition_from_lifecycle(event: events_pb2.JobLifecycle) -> Transition:
    return Transition(
        job_id=event.job.job_id,
        generation=event.job.generation,
        state=event.state,
        queue=event.queue,
        assignments=tuple(Assignment(a.node, tuple(a.gpu_indices), a.mig_slice) for a in event.assignments),
    )


def node_state(view: NodeView, version: int, now: float) -> events_pb2.NodeState:
    return events_pb2.NodeState(
        node=view.node,
        rack=view.rack,
        gpus=[
            events_pb2.GpuState(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.model,
                memory_mib=gpu.memory_mib,
                nvlink_island=gpu.nvlink_island,
                mig_enabled=gpu.mig_enabled,
                mig_slices=list(gpu.mig_slices),
                healthy=gpu.healthy,
                utilization_pct=gpu.utilization_pct,
                shareable=gpu.shareable,
            )
            for gpu in view.gpus
        ],
        cpu_milli=view.cpu_milli,
        memory_mib=view.memory_mib,
        healthy=view.healthy,
        last_seen=timestamp(view.last_seen),
        version=common_pb2.EntityVersion(version=version, observed_at=timestamp(now)),
        labels=dict(view.labels),
    )


def gpu_finding(finding: GpuFinding) -> events_pb2.GpuIdle | events_pb2.GpuBusy:
    """gpu.idle's GpuIdle for an idle finding, gpu.busy's GpuBusy for a busy one (the same fields but one)."""
    message: events_pb2.GpuIdle | events_pb2.GpuBusy
    if isinstance(finding, IdleFinding):
        message = events_pb2.GpuIdle(idle_gpu_seconds=finding.idle_gpu_seconds)
    else:
        message = events_pb2.GpuBusy()
    message.job.job_id = finding.job_id
    message.job.generation = finding.generation
    message.queue = finding.queue
    message.node = finding.node
    message.gpu_uuids.extend(finding.gpu_uuids)
    message.mean_utilization_pct = finding.mean_utilization_pct
    message.since.CopyFrom(timestamp(finding.since))
    message.until.CopyFrom(timestamp(finding.until))
    return message
