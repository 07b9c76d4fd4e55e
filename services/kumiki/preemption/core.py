"""The preemption coordinator's rules, pure: checkpoint bookkeeping and the protocol each victim goes through.

Placement decides who is preempted (its scheduling pass is the single writer of allocations); the coordinator
makes it happen without killing work: CHECKPOINT with a deadline → the job's acknowledgement (a checkpoint
report) → EVICT → placement releases the job and queues it again as the next generation → when that
generation is bound, RESUME with the checkpoint to restore. A job that does not acknowledge by the deadline is
evicted anyway, and the work since its newest acknowledged checkpoint is its lost work.

Every function takes a protocol and an input and returns the next protocol and the effects to carry out
(commands to publish, a release to ask placement for). The adapter stores the protocol and its effects in one
Postgres transaction (an outbox), so a SIGKILLed coordinator resumes every protocol where it stood and carries
out each effect at least once; effects are idempotent (command ids are deterministic, Release is idempotent).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from kumiki.sched.preemption import reason_problem


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    job_id: str
    generation: int
    uri: str
    step: int
    completed_unix_s: float
    total_steps: int = 0  # the step the job ends at (0: unknown); with `step`, how far it has got


MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the end of protobuf's Timestamp range


def validate_report(
    job_id: str, generation: int, uri: str, completed_unix_s: float, step: int = 0, total_steps: int = 0
) -> list[tuple[str, str]]:
    """Problems as (field, problem) pairs; empty when the report is acceptable."""
    problems = []
    if not job_id:
        problems.append(("job.job_id", "required"))
    if generation < 1:
        problems.append(("job.generation", "must be >= 1"))
    bounded = (("job.generation", generation), ("step", step), ("total_steps", total_steps))
    for name, value in bounded:  # Postgres bigint (found by tests/fuzz)
        if value > 2**63 - 1:
            problems.append((name, f"must be <= {2**63 - 1}, got {value}"))
    if 0 < total_steps < step:  # a job past its last step does not know where it ends: it says 0
        problems.append(("total_steps", f"must be 0 (unknown) or >= step ({step}), got {total_steps}"))
    if not uri:
        problems.append(("uri", "required"))
    if completed_unix_s <= 0:
        problems.append(("completed_at", "required"))
    elif completed_unix_s > MAX_TIMESTAMP_S:  # past a Timestamp's range, and datetime's (found by tests/fuzz)
        limit = f"must be before year 10000 (<= {MAX_TIMESTAMP_S} s)"
        problems.append(("completed_at", f"{limit}, got {completed_unix_s:.0f}"))
    return problems


def supersedes(new: CheckpointRecord, current: CheckpointRecord | None) -> bool:
    """A report becomes the latest when it is from a newer generation or a later step of the same one."""
    if current is None:
        return True
    return (new.generation, new.step, new.completed_unix_s) > (
        current.generation,
        current.step,
        current.completed_unix_s,
    )


def lost_work_seconds(now_unix_s: float, started_unix_s: float, latest: CheckpointRecord | None) -> float:
    """Work lost if the job stops now: time since its last checkpoint (or since it started)."""
    since = max(started_unix_s, latest.completed_unix_s) if latest else started_unix_s
    return max(0.0, now_unix_s - since)


# ---- the protocol --------------------------------------------------------------------------------------------


class Phase(StrEnum):
    CHECKPOINTING = "checkpointing"  # CHECKPOINT issued; waiting for the acknowledgement or the deadline
    EVICTING = "evicting"  # EVICT issued; placement's release (and requeue) outstanding
    REQUEUED = "requeued"  # released and queued again as the next generation; RESUME once that one is bound
    RESUMED = "resumed"  # RESUME issued to the next generation: done
    CANCELLED = "cancelled"  # the job ended (completed, failed, released) before it was evicted: done


OPEN_PHASES = frozenset({Phase.CHECKPOINTING, Phase.EVICTING, Phase.REQUEUED})

# Reasons a decision may give (SchedulingDecision.preemption_reason); anything else is reported as "other".
REASONS = frozenset(
    {"priority", "rank", "quota-reclaim", "idle-reclaim", "starvation", "reservation", "defragmentation", "other"}
)


class Action(StrEnum):
    CHECKPOINT = "checkpoint"
    EVICT = "evict"
    RESUME = "resume"


@dataclass(frozen=True, slots=True)
class PreemptRequest:
    """A PREEMPT / RECLAIM decision of placement, in core terms."""

    job_id: str
    generation: int
    queue: str
    gpus: float
    reason: str
    decision_id: str
    # when the victim's unsaved work began, as placement saw it at the decision (its bind, or its newest
    # acknowledged checkpoint): lost work counts from here when no newer checkpoint is acknowledged
    bound_unix_s: float
    beneficiary: str = ""
    beneficiary_generation: int = 0


def validate_request(request: PreemptRequest) -> list[tuple[str, str]]:
    problems = []
    if not request.job_id:
        problems.append(("job.job_id", "required"))
    if request.generation < 1:
        problems.append(("job.generation", "must be >= 1"))
    if request.gpus < 0:
        problems.append(("gpus", f"must be >= 0, got {request.gpus:g}"))
    if not request.decision_id:
        problems.append(("decision_id", "required"))
    reason_wrong = reason_problem(request.reason)
    if reason_wrong is not None:
        problems.append(("preemption_reason", reason_wrong))
    return problems


@dataclass(frozen=True, slots=True)
class Protocol:
    """One victim's way through the protocol; (job_id, generation) identifies it."""

    job_id: str
    generation: int
    queue: str
    gpus: float
    reason: str
    decision_id: str
    beneficiary: str
    beneficiary_generation: int
    phase: Phase
    requested_unix_s: float  # when CHECKPOINT was issued
    deadline_unix_s: float  # eviction follows at this time with or without an acknowledgement
    bound_unix_s: float
    checkpoint_uri: str = ""  # the newest acknowledged checkpoint at eviction (what RESUME restores)
    checkpoint_step: int = 0
    checkpoint_unix_s: float = 0.0
    acked_unix_s: float = 0.0  # when the acknowledgement arrived (0: none; forced)
    evicted_unix_s: float = 0.0
    forced: bool = False
    lost_gpu_seconds: float = 0.0
    resume_generation: int = 0

    def command_id(self, action: Action) -> str:
        """Deterministic: a command issued twice (a retry after a crash) has one id, and consumers dedupe it."""
        return f"{self.job_id}/{self.generation}/{action.value}"


@dataclass(frozen=True, slots=True)
class Command:
    """A command to publish (kumiki.preemption.commands) and deliver over Checkpoints.Watch."""

    action: Action
    command_id: str
    job_id: str
    generation: int  # the attempt the command is for (RESUME: the new generation)
    protocol_generation: int  # the preempted attempt whose protocol issues it


@dataclass(frozen=True, slots=True)
class Release:
    """Ask placement to release the evicted attempt as PREEMPTED (it queues the next generation)."""

    job_id: str
    generation: int
    lost_gpu_seconds: float


Effect = Command | Release


@dataclass(frozen=True, slots=True)
class Transition:
    protocol: Protocol
    effects: tuple[Effect, ...] = ()
    changed: bool = True


def _unchanged(protocol: Protocol) -> Transition:
    return Transition(protocol, (), changed=False)


def begin(
    existing: Protocol | None, request: PreemptRequest, now_unix_s: float, deadline_s: float
) -> Transition | None:
    """A decision to preempt: CHECKPOINT with a deadline. None when this attempt already has a protocol (the
    decision repeated, or placement decided again after a restart): one attempt is preempted once."""
    if existing is not None:
        return None
    protocol = Protocol(
        job_id=request.job_id,
        generation=request.generation,
        queue=request.queue,
        gpus=request.gpus,
        reason=request.reason if request.reason in REASONS else "other",
        decision_id=request.decision_id,
        beneficiary=request.beneficiary,
        beneficiary_generation=request.beneficiary_generation,
        phase=Phase.CHECKPOINTING,
        requested_unix_s=now_unix_s,
        deadline_unix_s=now_unix_s + max(0.0, deadline_s),
        bound_unix_s=min(request.bound_unix_s, now_unix_s) if request.bound_unix_s > 0 else now_unix_s,
    )
    if deadline_s <= 0:  # no time to checkpoint: evict at once
        return expire(protocol, None, now_unix_s)
    command = Command(
        Action.CHECKPOINT,
        protocol.command_id(Action.CHECKPOINT),
        request.job_id,
        request.generation,
        request.generation,
    )
    return Transition(protocol, (command,))


def _evict(protocol: Protocol, now_unix_s: float, latest: CheckpointRecord | None, *, forced: bool) -> Transition:
    lost_s = lost_work_seconds(now_unix_s, protocol.bound_unix_s, latest)
    evicted = replace(
        protocol,
        phase=Phase.EVICTING,
        checkpoint_uri=latest.uri if latest else "",
        checkpoint_step=latest.step if latest else 0,
        checkpoint_unix_s=latest.completed_unix_s if latest else 0.0,
        acked_unix_s=0.0 if forced else now_unix_s,
        evicted_unix_s=now_unix_s,
        forced=forced,
        lost_gpu_seconds=lost_s * protocol.gpus,
    )
    command = Command(
        Action.EVICT, protocol.command_id(Action.EVICT), protocol.job_id, protocol.generation, protocol.generation
    )
    return Transition(evicted, (command, Release(protocol.job_id, protocol.generation, evicted.lost_gpu_seconds)))


def acknowledge(protocol: Protocol, report: CheckpointRecord, now_unix_s: float) -> Transition:
    """A checkpoint of this attempt completed after CHECKPOINT was issued: evict now, losing only the moments
    since it completed. An older checkpoint (a periodic one written before the command) is no answer."""
    if (
        protocol.phase is not Phase.CHECKPOINTING
        or report.job_id != protocol.job_id
        or report.generation != protocol.generation
        or report.completed_unix_s < protocol.requested_unix_s
    ):
        return _unchanged(protocol)
    return _evict(protocol, now_unix_s, report, forced=False)


def expire(protocol: Protocol, latest: CheckpointRecord | None, now_unix_s: float) -> Transition:
    """The deadline passed without an acknowledgement: evict anyway; the work since `latest` (the newest
    acknowledged checkpoint, periodic or from an earlier attempt) is lost."""
    if protocol.phase is not Phase.CHECKPOINTING or now_unix_s < protocol.deadline_unix_s:
        return _unchanged(protocol)
    return _evict(protocol, now_unix_s, latest, forced=True)


def released(protocol: Protocol) -> Transition:
    """Placement released the evicted attempt (and queued the next generation)."""
    if protocol.phase is not Phase.EVICTING:
        return _unchanged(protocol)
    return Transition(replace(protocol, phase=Phase.REQUEUED))


def rebound(protocol: Protocol, generation: int) -> Transition:
    """A later generation of the job was bound: RESUME reaches it with the checkpoint to restore.

    Also from EVICTING: the bind can be read before the release call returned (it implies the release)."""
    if protocol.phase not in (Phase.EVICTING, Phase.REQUEUED) or generation <= protocol.generation:
        return _unchanged(protocol)
    resumed = replace(protocol, phase=Phase.RESUMED, resume_generation=generation)
    command = Command(
        Action.RESUME, f"{protocol.job_id}/{generation}/resume", protocol.job_id, generation, protocol.generation
    )
    return Transition(resumed, (command,))


def ended(protocol: Protocol, generation: int) -> Transition:
    """The attempt ended on its own (completed, failed, cancelled) before it was evicted: nothing to do."""
    if protocol.phase is not Phase.CHECKPOINTING or generation != protocol.generation:
        return _unchanged(protocol)
    return Transition(replace(protocol, phase=Phase.CANCELLED))


def commands_to_watch(protocol: Protocol | None, generation: int) -> tuple[Action, ...]:
    """What a Watch stream of this attempt must have seen by now, in order (a stream that opens late, or after a
    coordinator restart, gets the commands still relevant to it)."""
    if protocol is None:
        return ()
    if protocol.generation == generation:
        if protocol.phase is Phase.CHECKPOINTING:
            return (Action.CHECKPOINT,)
        if protocol.phase in (Phase.EVICTING, Phase.REQUEUED, Phase.RESUMED):
            return (Action.CHECKPOINT, Action.EVICT) if not protocol.forced else (Action.EVICT,)
        return ()
    if protocol.phase is Phase.RESUMED and protocol.resume_generation == generation:
        return (Action.RESUME,)
    return ()
