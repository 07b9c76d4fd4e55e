"""Between the binder's core values and the wire (kumiki.v1 messages): a node's `NodeState` record, a gang's
`JobState`, a topology (`TopologyConstraint`), a request read back from Placement's log, and Placement's answers
(`PodAssignment`, `PendingReason`). A pod's request is encoded by `kumiki.common.requests`, the encoding
Placement decodes with. The decisions stay in `kumiki.binder.core`; only their encoding lives here."""

from __future__ import annotations

from collections.abc import Iterable

from kumiki.binder import core
from kumiki.binder.core import GangOutcome, Node
from kumiki.common import requests
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.grpcutil import InvalidRequest
from kumiki.sched.jobs import PodRequest

JOB_STATES = {"completed": events_pb2.JOB_STATE_COMPLETED, "failed": events_pb2.JOB_STATE_FAILED}


def node_state(node: Node, telemetry: events_pb2.NodeState | None = None) -> events_pb2.NodeState:
    """The record placement reads for a node: the API's inventory (or telemetry's GPUs when it has seen the
    node), healthy only when telemetry says so AND the API has it schedulable and Ready."""
    if telemetry is not None and telemetry.gpus:
        gpus = [events_pb2.GpuState() for _ in telemetry.gpus]
        for copy, gpu in zip(gpus, telemetry.gpus, strict=True):
            copy.CopyFrom(gpu)
    else:
        gpus = [
            events_pb2.GpuState(
                index=index,
                uuid=node.gpu_uuids[index] if index < len(node.gpu_uuids) else "",
                model=node.gpu_model,
                memory_mib=node.gpu_memory_mib,
                nvlink_island=index // node.island_size,
                mig_enabled=node.mig,
                healthy=True,
                shareable=node.shareable,
            )
            for index in range(node.gpus)
        ]
    healthy = node.schedulable and (telemetry.healthy if telemetry is not None else True)
    labels = dict(telemetry.labels) if telemetry is not None else {}
    labels.update({key: value for key, value in node.labels.items() if len(key) < 128})
    labels["kumiki.io/source"] = "kubernetes"
    return events_pb2.NodeState(
        node=node.name,
        rack=(telemetry.rack if telemetry is not None and telemetry.rack else node.rack),
        gpus=gpus,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        healthy=healthy,
        version=common_pb2.EntityVersion(version=node.version),
        labels=labels,
    )


def same_node_state(a: events_pb2.NodeState, b: events_pb2.NodeState) -> bool:
    """Equal apart from the version and observation time (what makes a republication worth it)."""
    left, right = events_pb2.NodeState(), events_pb2.NodeState()
    left.CopyFrom(a)
    right.CopyFrom(b)
    for message in (left, right):
        message.ClearField("version")
        message.ClearField("last_seen")
    return left == right


def job_state(outcome: GangOutcome | None) -> events_pb2.JobState.ValueType:
    """`core.gang_outcome` as the JobState a Release carries: UNSPECIFIED while some pod still runs."""
    return JOB_STATES[outcome] if outcome is not None else events_pb2.JOB_STATE_UNSPECIFIED


def pod_request(message: common_pb2.PodResources) -> PodRequest | None:
    """A logged request (a `job.lifecycle` event's pods) as the core compares it; None when it cannot be one."""
    try:
        return requests.pod_request(0, message)
    except InvalidRequest:
        return None


def topology_constraint(topology: core.Topology) -> common_pb2.TopologyConstraint:
    level = requests.TOPOLOGY_TO_WIRE[topology.level] if topology.level else common_pb2.TOPOLOGY_LEVEL_UNSPECIFIED
    return common_pb2.TopologyConstraint(level=level, required=topology.required)


def topology(message: common_pb2.TopologyConstraint) -> core.Topology:
    return core.Topology(level=requests.TOPOLOGY_FROM_WIRE.get(message.level, ""), required=message.required)


def pod_assignment(message: common_pb2.PodAssignment) -> core.PodAssignment:
    return core.PodAssignment(
        pod_index=message.pod_index,
        node=message.node,
        gpu_indices=tuple(message.gpu_indices),
        mig_slice=message.mig_slice,
        gpu_fraction=message.gpu_fraction,
    )


def pod_assignments(messages: Iterable[common_pb2.PodAssignment]) -> list[core.PodAssignment]:
    return [pod_assignment(message) for message in messages]


def pending_reason(message: common_pb2.PendingReason) -> core.PendingReason:
    return core.PendingReason(
        code=message.code, resource=message.resource, node_shape=message.node_shape, message=message.message
    )
