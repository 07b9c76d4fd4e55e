"""Between the wire (kumiki.v1 messages) and quota's core, which imports no generated code. Every Admit field
is validated here and a problem becomes InvalidRequest naming the field, so the servicer can answer
INVALID_ARGUMENT; lifecycle states map onto the core's LifecycleState; core values become the messages quota
answers and publishes."""

from __future__ import annotations

from collections.abc import Iterable

from kumiki.common.contracts.v1 import common_pb2, events_pb2, quota_pb2
from kumiki.common.grpcutil import InvalidRequest, require_finite, require_job, timestamp
from kumiki.common.node_state import takes_work
from kumiki.quota.adapters.store import UsageRow
from kumiki.quota.core import Admission, AdmitRequest, LifecycleState, Outcome, QueueStatus

# wire state -> the ledger's; any other value (submitted, admitted, checkpointing, resumed, unspecified, or a
# number this build does not know) is OTHER, which neither opens nor closes a meter
LIFECYCLE_FROM_WIRE: dict[int, LifecycleState] = {
    events_pb2.JOB_STATE_BOUND: LifecycleState.BOUND,
    events_pb2.JOB_STATE_RUNNING: LifecycleState.RUNNING,
    events_pb2.JOB_STATE_PREEMPTED: LifecycleState.PREEMPTED,
    events_pb2.JOB_STATE_COMPLETED: LifecycleState.COMPLETED,
    events_pb2.JOB_STATE_FAILED: LifecycleState.FAILED,
    events_pb2.JOB_STATE_RELEASED: LifecycleState.RELEASED,
}


def node_gpus(state: events_pb2.NodeState) -> tuple[str, float]:
    """A cluster.state record as (GPU model, GPUs that can take work): all of them while the node takes work
    (`takes_work`, Placement's rule), none otherwise. A node of several models counts under the first."""
    model = state.gpus[0].model if state.gpus else ""
    return model, float(len(state.gpus)) if takes_work(state) else 0.0


def lifecycle_state(state: int) -> LifecycleState:
    """The core's state for a job.lifecycle `state` (an int: unknown enum values arrive as plain numbers)."""
    return LIFECYCLE_FROM_WIRE.get(state, LifecycleState.OTHER)


def admit_request(request: quota_pb2.AdmitRequest) -> AdmitRequest:
    """A validated core request from an Admit request."""
    require_job(request.job)
    if not request.queue:
        raise InvalidRequest("queue", "required")
    require_finite("gpus", request.gpus)
    return AdmitRequest(
        job_id=request.job.job_id,
        generation=request.job.generation,
        queue=request.queue,
        gpus=request.gpus,
        gpu_model=request.gpu_model,
        priority_tier=request.priority_tier,
        preemptible=request.preemptible,
    )


def admission_response(admission: Admission) -> quota_pb2.AdmitResponse:
    return quota_pb2.AdmitResponse(
        admitted=admission.admitted,
        borrowed=admission.outcome is Outcome.BORROWED,
        reason=common_pb2.PendingReason(code=admission.code, resource=admission.resource, message=admission.message),
    )


def usage_response(rows: Iterable[UsageRow]) -> quota_pb2.UsageResponse:
    return quota_pb2.UsageResponse(
        usage=[
            quota_pb2.QueueUsage(
                queue=row.queue,
                gpu_model=row.gpu_model,
                priority_tier=row.priority_tier,
                gpu_seconds=float(row.gpu_seconds),
                cost=float(row.cost),
            )
            for row in rows
        ]
    )


def quota_state(status: QueueStatus, version: int) -> events_pb2.QuotaState:
    """One queue's quota.state record (compacted per queue: `version` orders its records)."""
    return events_pb2.QuotaState(
        queue=status.queue,
        guaranteed_gpus=status.guaranteed_gpus,
        limit_gpus=status.limit_gpus,
        used_gpus=status.used_gpus,
        borrowed_gpus=status.borrowed_gpus,
        lent_gpus=status.lent_gpus,
        fair_share_gpus=status.fair_share_gpus,
        version=common_pb2.EntityVersion(version=version, observed_at=timestamp()),
    )


def reclaim_event(row: dict[str, object]) -> events_pb2.SchedulingDecision:
    """A reclaim decision of the outbox (quota.reclaim_decisions) as the RECLAIM on scheduling.decisions."""
    return events_pb2.SchedulingDecision(
        decision_id=str(row["decision_id"]),
        kind=events_pb2.DECISION_KIND_RECLAIM,
        job=common_pb2.JobRef(job_id=str(row["victim_job"]), generation=int(row["victim_generation"])),  # type: ignore[call-overload]
        queue=str(row["victim_queue"]),
        beneficiary=common_pb2.JobRef(
            job_id=str(row["beneficiary_job"]),
            generation=int(row["beneficiary_generation"]),  # type: ignore[call-overload]
        ),
        reasons=[
            common_pb2.PendingReason(
                code="reclaim",
                resource="gpus",
                message=(
                    f"queue {row['beneficiary_queue']} is below its guarantee and needs its lent GPUs back;"
                    f" {row['victim_queue']} is over its guarantee (borrowed {row['gpus']:g} GPUs)"
                ),
            )
        ],
        policy="kumiki-quota",
        at=timestamp(),
    )
