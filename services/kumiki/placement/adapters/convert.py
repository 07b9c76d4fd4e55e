"""Between the wire (kumiki.v1 messages) and placement's core. Every request field is validated here and a
problem becomes InvalidRequest naming the field, so the servicer can answer INVALID_ARGUMENT."""

from __future__ import annotations

from datetime import UTC, datetime

from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2
from kumiki.common.grpcutil import InvalidRequest, job_feature_fields, require_finite, require_job, timestamp
from kumiki.common.requests import TOPOLOGY_FROM_WIRE, TOPOLOGY_TO_WIRE, pod_request, pod_resources
from kumiki.placement.core import BindCommand, BoundJob, Explanation
from kumiki.sched.cluster import GpuShare, MigSlice, NodeSpec, PodPlacement
from kumiki.sched.forecasting import RuntimeForecast
from kumiki.sched.jobs import MIB_PER_GB, GangRequest
from kumiki.sched.placement import PendingReason
from kumiki.sched.preemption import reason_problem

MAX_PODS = 4096


class InvalidNodeState(ValueError):
    """A cluster.state record that cannot describe a node; the message names the field."""


def bind_command(request: placement_pb2.BindRequest) -> BindCommand:
    """A validated core command from a Bind request."""
    require_job(request.job)
    if not request.queue:
        raise InvalidRequest("queue", "required")
    if not request.pods:
        raise InvalidRequest("pods", "at least one pod is required")
    if len(request.pods) > MAX_PODS:
        raise InvalidRequest("pods", f"at most {MAX_PODS} pods per gang, got {len(request.pods)}")
    if request.min_members > len(request.pods):
        raise InvalidRequest("min_members", f"must be <= the number of pods ({len(request.pods)})")
    if request.topology.level not in TOPOLOGY_FROM_WIRE:
        raise InvalidRequest("topology.level", f"unknown level {request.topology.level}")
    required = TOPOLOGY_FROM_WIRE[request.topology.level] if request.topology.required else ""
    shared = required in ("node", "nvlink_island") and (request.min_members or len(request.pods)) > 1
    if request.topology.distinct_nodes and shared:
        raise InvalidRequest(
            "topology.distinct_nodes", f"the pods cannot each have a node of their own and share one ({required})"
        )
    return _command(request, required)


def _command(source: placement_pb2.BindRequest | events_pb2.JobLifecycle, required: str) -> BindCommand:
    """The core command from a Bind request or the SUBMITTED event that recorded one (the same fields)."""
    pods = tuple(pod_request(index, pod) for index, pod in enumerate(source.pods))
    image, command_line, time_limit_s = job_feature_fields(source)
    return BindCommand(
        job_id=source.job.job_id,
        generation=source.job.generation,
        queue=source.queue,
        request=GangRequest(
            source.job.job_id,
            pods,
            source.min_members,
            required_topology=required,
            distinct_nodes=source.topology.distinct_nodes,
        ),
        priority_tier=source.priority_tier,
        preemptible=source.preemptible,
        user=source.user,
        name=source.name,
        image=image,
        command_line=command_line,
        time_limit_s=time_limit_s,
    )


def runtime_forecast(message: events_pb2.RuntimeForecast) -> RuntimeForecast:
    """A forecast off the bus; InvalidRequest naming the field when a quantile or spread is not a usable number."""
    p50_s = require_finite("p50_s", message.p50_s, positive=True)
    # a p90 below the p50 (two quantile regressions can cross) is kept: the policies read max(p50, p90)
    p90_s = require_finite("p90_s", message.p90_s, positive=True)
    log_sigma = require_finite("log_sigma", message.log_sigma) if message.HasField("log_sigma") else None
    error_sigma = require_finite("error_sigma", message.error_sigma) if message.HasField("error_sigma") else None
    return RuntimeForecast(p50_s, p90_s, message.model, message.model_version, log_sigma, error_sigma=error_sigma)


def node_spec(state: events_pb2.NodeState) -> NodeSpec:
    """The scheduling core's view of one cluster.state record."""
    if not state.node:
        raise InvalidNodeState("node: required")
    indices = sorted(gpu.index for gpu in state.gpus)
    if indices != list(range(len(indices))):
        raise InvalidNodeState(f"gpus.index: expected 0..{len(indices) - 1} without gaps, got {indices}")
    gpus = sorted(state.gpus, key=lambda gpu: gpu.index)
    models = {gpu.model for gpu in gpus}
    if len(models) > 1:
        raise InvalidNodeState(f"gpus.model: one model per node expected, got {sorted(models)}")
    islands: dict[int, list[int]] = {}
    for gpu in gpus:
        islands.setdefault(gpu.nvlink_island, []).append(gpu.index)
    try:
        return NodeSpec(
            name=state.node,
            gpus=len(gpus),
            gpu_model=gpus[0].model if gpus else "",
            gpu_memory_gb=gpus[0].memory_mib / MIB_PER_GB if gpus else 0.0,
            cpu_milli=state.cpu_milli,
            memory_mib=state.memory_mib,
            rack=state.rack or "rack-0",
            nvlink_islands=tuple(tuple(members) for _, members in sorted(islands.items())) if len(islands) > 1 else (),
            mig_gpus=frozenset(gpu.index for gpu in gpus if gpu.mig_enabled),
            sharing=any(gpu.shareable for gpu in gpus),
        )
    except ValueError as error:
        raise InvalidNodeState(str(error)) from None


def assignments(job: BoundJob) -> list[common_pb2.PodAssignment]:
    out = []
    for name, pod in zip(job.node_names, job.placement.pods, strict=True):
        assignment = common_pb2.PodAssignment(pod_index=pod.pod, node=name, gpu_indices=list(pod.gpus))
        if pod.share is not None:
            assignment.gpu_indices.append(pod.share.gpu)
            assignment.gpu_fraction = pod.share.fraction
        if pod.mig is not None:
            assignment.gpu_indices.append(pod.mig.gpu)
            assignment.mig_slice = f"{pod.mig.profile}@{pod.mig.start}"
        out.append(assignment)
    return out


def lifecycle(
    job: BoundJob,
    state: int,
    reason: str = "",
    placed: list[common_pb2.PodAssignment] | None = None,
    runtime_s: float = 0.0,
) -> events_pb2.JobLifecycle:
    """A job.lifecycle event that carries everything needed to rebuild the allocation after a restart.

    `placed`: `assignments(job)` when the caller already has them."""
    event = command_lifecycle(job.command, state, reason)
    event.assignments.extend(assignments(job) if placed is None else placed)
    event.runtime_s = runtime_s
    return event


def explain_response(explanation: Explanation) -> placement_pb2.ExplainResponse:
    response = placement_pb2.ExplainResponse(
        status=explanation.status,
        queue=explanation.queue,
        queue_position=explanation.queue_position,
        reasons=[pending_reason(reason) for reason in explanation.reasons],
        executed_seconds=explanation.service.executed_s,
        attained_gpu_seconds=explanation.service.attained_gpu_s,
        evictions=explanation.service.preemptions,
        idle_reclaims=explanation.service.idle_reclaims,
        demoted=explanation.service.demoted,
    )
    if explanation.job is not None:
        response.assignments.extend(assignments(explanation.job))
    if explanation.waiting_since_s is not None:
        response.waiting_since.CopyFrom(timestamp(datetime.fromtimestamp(explanation.waiting_since_s, UTC)))
    if explanation.starves_at_s is not None:
        response.starves_at.CopyFrom(timestamp(datetime.fromtimestamp(explanation.starves_at_s, UTC)))
    return response


# How Release may say a job ended (anything else is not an ending placement can report).
FINAL_STATES = {
    events_pb2.JOB_STATE_UNSPECIFIED: events_pb2.JOB_STATE_RELEASED,
    events_pb2.JOB_STATE_RELEASED: events_pb2.JOB_STATE_RELEASED,
    events_pb2.JOB_STATE_COMPLETED: events_pb2.JOB_STATE_COMPLETED,
    events_pb2.JOB_STATE_FAILED: events_pb2.JOB_STATE_FAILED,
    events_pb2.JOB_STATE_PREEMPTED: events_pb2.JOB_STATE_PREEMPTED,  # the preemption coordinator, after EVICT
}


def release_state(request: placement_pb2.ReleaseRequest) -> int:
    """The lifecycle state a Release publishes; InvalidRequest names the field."""
    require_job(request.job, generation=False)  # 0: whatever generation holds it
    state = FINAL_STATES.get(request.final_state)
    if state is None:
        raise InvalidRequest(
            "final_state",
            "JOB_STATE_COMPLETED, JOB_STATE_FAILED, JOB_STATE_PREEMPTED or JOB_STATE_RELEASED,"
            f" got {request.final_state}",
        )
    if request.lost_gpu_seconds < 0 or request.lost_gpu_seconds != request.lost_gpu_seconds:
        raise InvalidRequest("lost_gpu_seconds", f"must be >= 0, got {request.lost_gpu_seconds}")
    reason_wrong = reason_problem(request.preemption_reason) if request.preemption_reason else None
    if reason_wrong is not None:
        raise InvalidRequest("preemption_reason", reason_wrong)
    return state


def command_lifecycle(
    command: BindCommand, state: int, reason: str = "", at_s: float | None = None
) -> events_pb2.JobLifecycle:
    """A job.lifecycle event with the whole request (SUBMITTED re-queues a waiting job after a restart)."""
    event = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=command.job_id, generation=command.generation),
        state=state,  # type: ignore[arg-type]
        at=timestamp() if at_s is None else timestamp(datetime.fromtimestamp(at_s, UTC)),
        queue=command.queue,
        user=command.user,
        priority_tier=command.priority_tier,
        preemptible=command.preemptible,
        pods=[pod_resources(pod) for pod in command.request.pods],
        min_members=command.request.min_members,
        gpus=command.request.gpu_demand,
        name=command.name,
        reason=reason,
        image=command.image,
        command=command.command_line,
    )
    if command.time_limit_s is not None:
        event.time_limit_s = command.time_limit_s
    if command.request.required_topology:
        event.topology.level = TOPOLOGY_TO_WIRE[command.request.required_topology]
        event.topology.required = True
    event.topology.distinct_nodes = command.request.distinct_nodes
    return event


def command_from_lifecycle(event: events_pb2.JobLifecycle) -> BindCommand:
    """The bind request a lifecycle event recorded (`command_lifecycle` read back)."""
    required = TOPOLOGY_FROM_WIRE.get(event.topology.level, "") if event.topology.required else ""
    return _command(event, required)


def restore_from_lifecycle(event: events_pb2.JobLifecycle) -> tuple[BindCommand, list[tuple[str, PodPlacement]]]:
    """The bind a BOUND event recorded, as a command and named pod placements."""
    command = command_from_lifecycle(event)
    pods = command.request.pods
    placed = []
    for assignment in event.assignments:
        pod = pods[assignment.pod_index]
        gpus = tuple(assignment.gpu_indices)
        share = mig = None
        if assignment.mig_slice:
            profile, _, start = assignment.mig_slice.partition("@")
            mig = MigSlice(gpus[0], profile, int(start))
            gpus = ()
        elif assignment.gpu_fraction:
            share = GpuShare(gpus[0], assignment.gpu_fraction, pod.gpu_memory_gb)
            gpus = ()
        placed.append(
            (
                assignment.node,
                PodPlacement(
                    assignment.pod_index, 0, gpus, share, mig, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib
                ),
            )
        )
    return command, placed


SPECIAL_CODES = {
    "reservation": "reserved_for_other_job",
    "nodes": "no_nodes",
    "gpu_model": "gpu_model_unavailable",
    "restart": "awaiting_admission",
}


def pending_reason(reason: PendingReason) -> common_pb2.PendingReason:
    """The wire form; `code` is machine-readable (insufficient_gpu, topology_unsatisfiable, quota_exceeded...)."""
    resource = reason.resource.split(":")[0]
    if resource in SPECIAL_CODES:
        code = SPECIAL_CODES[resource]
    elif resource == "topology":
        code = "topology_unsatisfiable"
    elif resource == "quota":
        code = "quota_exceeded"
    else:
        code = f"insufficient_{resource}"
    return common_pb2.PendingReason(
        code=code, resource=reason.resource, node_shape=reason.node_shape, message=reason.explain()
    )
