"""Ledger arithmetic: which lifecycle states open and close a job's meter, exact GPU-seconds in whole
microseconds, cost, and the in-memory book the simulator keeps (the service keeps the same rows in
Postgres). States are the core's own `LifecycleState`; quota.adapters.convert maps the wire's onto it."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from enum import Enum

from kumiki.quota.core.resources import ANY_MODEL


class Effect(Enum):
    OPEN = "open"  # the job's GPUs start counting
    CLOSE = "close"  # they stop
    NONE = "none"


class LifecycleState(Enum):
    """The job lifecycle states the ledger tells apart. Every other state (submitted, admitted, checkpointing,
    resumed, unspecified, or one this build does not know) is OTHER and changes nothing."""

    OTHER = "other"
    BOUND = "bound"
    RUNNING = "running"
    PREEMPTED = "preempted"
    COMPLETED = "completed"
    FAILED = "failed"
    RELEASED = "released"


# What a team pays for is what placement allocated to it: the meter opens at BOUND (placement published the
# allocation, whatever integration asked for it). RUNNING opens it only where no BOUND came first (a cluster
# integration that binds outside placement); after a BOUND it changes nothing, so a job is never billed twice.
OPENING_STATES = frozenset({LifecycleState.BOUND, LifecycleState.RUNNING})
CLOSING_STATES = frozenset(
    {LifecycleState.COMPLETED, LifecycleState.FAILED, LifecycleState.PREEMPTED, LifecycleState.RELEASED}
)
# States that end an admission (the quota it held is free again).
RELEASING_STATES = CLOSING_STATES


def lifecycle_effect(state: LifecycleState) -> Effect:
    """BOUND (or RUNNING, whichever comes first) starts the meter; completed, failed, preempted and released
    stop it. RESUMED (OTHER here) is a requeue (the next generation's BOUND starts the meter again): nothing."""
    if state in OPENING_STATES:
        return Effect.OPEN
    if state in CLOSING_STATES:
        return Effect.CLOSE
    return Effect.NONE


MICROS = 1_000_000


def timestamp_micros(seconds: int, nanos: int) -> int:
    """Ledger time is whole microseconds (Postgres timestamptz resolution), so sums are exact."""
    return seconds * MICROS + nanos // 1000


def gpus_decimal(gpus: float) -> Decimal:
    """GPUs as the shortest decimal that round-trips the double (0.46, not 0.46000000000000002)."""
    return Decimal(repr(gpus))


def gpu_seconds(gpus: Decimal, start_us: int, end_us: int) -> Decimal:
    """Exact GPU-seconds of an interval (no float rounding: the ledger must add up to the second)."""
    return gpus * Decimal(max(0, end_us - start_us)) / MICROS


def overlap_micros(start_us: int, end_us: int, since_us: int, until_us: int) -> int:
    return max(0, min(end_us, until_us) - max(start_us, since_us))


def cost(gpu_secs: Decimal, rate_per_gpu_hour: Decimal) -> Decimal:
    return gpu_secs * rate_per_gpu_hour / 3600


@dataclass(frozen=True, slots=True)
class OpenInterval:
    job_id: str
    generation: int
    queue: str
    gpu_model: str
    priority_tier: int
    gpus: Decimal
    start_us: int


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    job_id: str
    generation: int
    queue: str
    gpu_model: str
    priority_tier: int
    gpus: Decimal
    start_us: int
    end_us: int
    final_state: LifecycleState

    @property
    def gpu_seconds(self) -> Decimal:
        return gpu_seconds(self.gpus, self.start_us, self.end_us)


@dataclass
class Ledger:
    """The ledger's rules as an in-memory book (the simulator's ledger; the service keeps the same rows in
    Postgres). One metered interval per (job, generation): a repeated RUNNING, a stop without a start or an
    event for an already closed generation changes nothing, so replays never count twice."""

    open: dict[tuple[str, int], OpenInterval] = field(default_factory=dict)
    closed: dict[tuple[str, int], LedgerEntry] = field(default_factory=dict)

    def apply(
        self,
        *,
        job_id: str,
        generation: int,
        state: LifecycleState,
        at_us: int,
        queue: str = "",
        gpu_model: str = ANY_MODEL,
        priority_tier: int = 0,
        gpus: Decimal = Decimal(0),
    ) -> LedgerEntry | None:
        key = (job_id, generation)
        effect = lifecycle_effect(state)
        if key in self.closed or effect is Effect.NONE:
            return None
        if effect is Effect.OPEN:
            if key not in self.open:
                self.open[key] = OpenInterval(job_id, generation, queue, gpu_model, priority_tier, gpus, at_us)
            return None
        interval = self.open.pop(key, None)
        if interval is None:
            return None
        entry = LedgerEntry(
            job_id,
            generation,
            interval.queue,
            interval.gpu_model,
            interval.priority_tier,
            interval.gpus,
            interval.start_us,
            max(at_us, interval.start_us),
            state,
        )
        self.closed[key] = entry
        return entry

    def total_gpu_seconds(self) -> Decimal:
        return sum((entry.gpu_seconds for entry in self.closed.values()), Decimal(0))


def team_of(queue: str) -> str:
    """organisation/team: the first two levels of a queue path (the report's --by team)."""
    return "/".join(queue.split("/")[:2])
