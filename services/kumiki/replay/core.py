"""The live replay's rules, with no I/O: which jobs a trace becomes, the queue trees of the baseline and of
Kumiki, and the efficiency figures of a finished run. The driver (`kumiki.replay.driver`) does the talking;
the simulator-side comparison uses the same job shapes (`consolidated_gang`), so live and simulated runs see
the same work.

Times here are *trace* seconds: the driver divides them by the speed-up on the way out and multiplies the
wall-clock times it measures back on the way in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kumiki.quota.core import ANY_MODEL, Queue, QuotaConfig, build_config
from kumiki.sched.jobs import consolidated_gang
from kumiki.sim.scenarios import RANK_CHECK_FIRST_S, is_idle_job, progress_marks
from kumiki.sim.trace import TraceJob


class ReplayError(ValueError):
    """A trace or setting the replay cannot run; the message names the job or option."""


# baseline: static per-queue quotas with FIFO; kumiki: guarantees with borrowing and the stack's policy;
# open: the stack's policy with no quota admission at all (the simulator's setting, for live-against-simulated)
PHASES = ("baseline", "kumiki", "open")
DEFAULT_PHASES = ("baseline", "kumiki")


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One trace job as the replay submits it: a gang of consolidated pods (Philly's shape)."""

    job_id: str
    queue: str
    submit_s: float
    duration_s: float
    gpus: int
    pods: tuple[int, ...]  # GPUs per pod
    idle: bool  # a "zombie": holds its GPUs for its whole run and computes nothing


def next_report_mark(progress_s: float, duration_s: float, first_s: float = RANK_CHECK_FIRST_S) -> float | None:
    """The progress (trace seconds) at which a job that reports progress next reports, having done `progress_s`:
    the simulator's next mark past it (`progress_marks`), so the live replay and its simulated counterpart report
    alike; None when the job ends before it."""
    return next((mark for mark in progress_marks(duration_s, first_s) if mark > progress_s), None)


def plan_jobs(
    trace: Sequence[TraceJob], *, gpus_per_node: int, nodes: int, idle_fraction: float = 0.0, seed: int = 0
) -> list[ReplayJob]:
    """The trace's jobs in submit order, rebased so the first arrives at 0; names the job and field it rejects."""
    if not 0.0 <= idle_fraction < 1.0:
        raise ReplayError(f"--idle-fraction: expected 0 <= f < 1, got {idle_fraction}")
    if not trace:
        raise ReplayError("--trace: the trace has no jobs")
    capacity = gpus_per_node * nodes
    jobs = []
    for job in trace:
        if job.submit_s is None or job.duration_s is None:
            empty = "submit_s" if job.submit_s is None else "duration_s"
            raise ReplayError(f"job {job.job_id}: field {empty!r} is empty; the replay needs it")
        if job.gpus != int(job.gpus) or job.gpus < 1:
            raise ReplayError(f"job {job.job_id}: field 'gpus' must be a whole number >= 1, got {job.gpus:g}")
        if job.gpus > capacity:
            raise ReplayError(f"job {job.job_id}: field 'gpus' is {job.gpus:g}, more than the cluster's {capacity}")
        gang = consolidated_gang(job.job_id, int(job.gpus), gpus_per_node)
        jobs.append(
            ReplayJob(
                job.job_id,
                job.queue or "default",
                job.submit_s,
                job.duration_s,
                int(job.gpus),
                tuple(int(pod.gpus) for pod in gang.pods),
                is_idle_job(job.job_id, idle_fraction, seed),  # the draw the simulated twin makes
            )
        )
    jobs.sort(key=lambda job: (job.submit_s, job.job_id))
    first = jobs[0].submit_s
    return [ReplayJob(j.job_id, j.queue, j.submit_s - first, j.duration_s, j.gpus, j.pods, j.idle) for j in jobs]


def guarantees(jobs: Sequence[ReplayJob], capacity_gpus: int, weights: Mapping[str, float]) -> dict[str, float]:
    """Each queue's guaranteed GPUs: its weight's share of the cluster (Philly: the VC's nodes), among the queues
    the trace uses. Queues the weights do not name get the smallest named weight. Whole GPUs, summing to at
    most the capacity."""
    queues = sorted({job.queue for job in jobs})
    floor = min(weights.values()) if weights else 1.0
    share = {queue: max(weights.get(queue, floor), 0.0) or floor for queue in queues}
    total = sum(share.values())
    return {queue: math.floor(capacity_gpus * share[queue] / total) for queue in queues}


def queue_tree(
    jobs: Sequence[ReplayJob], capacity_gpus: int, weights: Mapping[str, float], *, static: bool
) -> QuotaConfig:
    """The baseline's static quotas (each queue capped at its guarantee: today's clusters) or Kumiki's tree
    (the same guarantees; idle GPUs lent to whoever waits). A static quota is never below the queue's largest
    job, which would otherwise never run; a cluster too small for that is an error, not a replay that hangs."""
    guaranteed = guarantees(jobs, capacity_gpus, weights)
    largest: dict[str, int] = {}
    for job in jobs:
        largest[job.queue] = max(largest.get(job.queue, 0), job.gpus)
    if static:
        guaranteed = {name: max(gpus, largest[name]) for name, gpus in guaranteed.items()}
        if sum(guaranteed.values()) > capacity_gpus:
            raise ReplayError(
                f"--nodes: static quotas that hold each queue's largest job need {sum(guaranteed.values())} GPUs,"
                f" more than the cluster's {capacity_gpus}; replay on more nodes or without the baseline phase"
            )
    queues = [
        Queue(name, None, {ANY_MODEL: float(gpus)}, limit_gpus=float(gpus) if static else None)
        for name, gpus in sorted(guaranteed.items())
    ]
    return build_config(queues, {ANY_MODEL: float(capacity_gpus)})


# --- results ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one job, in trace seconds since the replay's start."""

    job_id: str
    queue: str
    gpus: int
    submitted_s: float
    bound_s: float
    ended_s: float
    idle: bool
    runs: int = 1  # times it was bound (more than once: it was preempted and resumed)
    lost_gpu_s: float = 0.0
    holds: tuple[tuple[float, float], ...] = ()  # (bound, freed) of each attempt; () means one, bound to ended
    found_idle: int = 0  # attempts telemetry reported idle
    reclaimed: int = 0  # of those, attempts preempted afterwards (idle reclaim)
    found_after_s: tuple[float, ...] = ()  # each found attempt: from its bind to telemetry's finding
    reclaimed_after_s: tuple[float, ...] = ()  # each attempt reclaimed: from that finding to its eviction

    @property
    def held(self) -> tuple[tuple[float, float], ...]:
        return self.holds or ((self.bound_s, self.ended_s),)

    @property
    def held_s(self) -> float:
        return sum(end - start for start, end in self.held)

    @property
    def jct_s(self) -> float:
        return self.ended_s - self.submitted_s

    @property
    def queue_s(self) -> float:
        return self.bound_s - self.submitted_s


@dataclass(frozen=True, slots=True)
class PhaseSummary:
    phase: str
    jobs: int
    completed: int
    avg_jct_s: float
    p95_jct_s: float
    avg_queue_s: float
    makespan_s: float
    allocation_under_backlog: float  # GPUs allocated / capacity, while at least one job waits
    utilisation_under_backlog: float  # GPUs computing (allocated to jobs that are not idle) / capacity, same times
    idle_gpu_h: float  # GPU-hours allocated to jobs that computed nothing
    lost_gpu_h: float  # GPU-hours of work lost to preemption
    jobs_per_gpu_h: float  # completed jobs per GPU-hour the cluster offered over the makespan
    backlog_h: float  # hours during which some job waited
    idle_found: int = 0  # job attempts telemetry reported idle from the nodes' GPU samples
    idle_reclaimed: int = 0  # of those, attempts placement reclaimed (checkpointed, evicted, requeued)
    # how long telemetry took to find a zombie, from the attempt's bind to its gpu.idle (median and p90; 0: none
    # found): the rule's own duration, plus sampling, batching and the broker, which a speed-up magnifies
    idle_found_after_s: float = 0.0
    idle_found_after_p90_s: float = 0.0
    # how long idle reclaim took, from the finding to the eviction (median and p90): placement's cycle and the
    # checkpoint handshake (CHECKPOINT, the job's report, the eviction), each a broker round trip
    idle_reclaimed_after_s: float = 0.0
    idle_reclaimed_after_p90_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _backlog_shares(outcomes: Sequence[Outcome], capacity_gpus: int) -> tuple[float, float, float]:
    """(backlog seconds, allocated GPU-share and busy GPU-share averaged over the seconds with a backlog)."""
    changes: list[tuple[float, int, int, int]] = []  # time, waiting delta, allocated delta, busy delta
    for outcome in outcomes:
        # a job waits from its submission to each bind, and again from each preemption to its next bind
        changes.append((outcome.submitted_s, 1, 0, 0))
        busy = 0 if outcome.idle else outcome.gpus
        held = outcome.held
        for number, (start, end) in enumerate(held):
            changes.append((start, -1, outcome.gpus, busy))
            changes.append((end, 1 if number < len(held) - 1 else 0, -outcome.gpus, -busy))
    changes.sort(key=lambda change: change[0])
    waiting = allocated = busy = 0
    backlog_s = allocated_area = busy_area = 0.0
    previous = changes[0][0] if changes else 0.0
    for at, d_wait, d_alloc, d_busy in changes:
        span = at - previous
        if waiting > 0 and span > 0:
            backlog_s += span
            allocated_area += span * allocated
            busy_area += span * busy
        waiting += d_wait
        allocated += d_alloc
        busy += d_busy
        previous = at
    if backlog_s <= 0:
        return 0.0, 0.0, 0.0
    return backlog_s, allocated_area / backlog_s / capacity_gpus, busy_area / backlog_s / capacity_gpus


def summarise(phase: str, outcomes: Sequence[Outcome], planned: int, capacity_gpus: int) -> PhaseSummary:
    """The report's figures for one phase; `planned`: how many jobs were submitted."""
    jcts = [outcome.jct_s for outcome in outcomes]
    start = min((o.submitted_s for o in outcomes), default=0.0)
    end = max((o.ended_s for o in outcomes), default=0.0)
    makespan = end - start
    backlog_s, allocated, busy = _backlog_shares(outcomes, capacity_gpus)
    idle_gpu_s = sum(o.gpus * o.held_s for o in outcomes if o.idle)
    offered_gpu_h = capacity_gpus * makespan / 3600.0
    found_after = [delay for o in outcomes for delay in o.found_after_s]
    reclaimed_after = [delay for o in outcomes for delay in o.reclaimed_after_s]
    return PhaseSummary(
        phase=phase,
        jobs=planned,
        completed=len(outcomes),
        avg_jct_s=sum(jcts) / len(jcts) if jcts else 0.0,
        p95_jct_s=percentile(jcts, 95),
        avg_queue_s=sum(o.queue_s for o in outcomes) / len(outcomes) if outcomes else 0.0,
        makespan_s=makespan,
        allocation_under_backlog=allocated,
        utilisation_under_backlog=busy,
        idle_gpu_h=idle_gpu_s / 3600.0,
        lost_gpu_h=sum(o.lost_gpu_s for o in outcomes) / 3600.0,
        jobs_per_gpu_h=len(outcomes) / offered_gpu_h if offered_gpu_h > 0 else 0.0,
        backlog_h=backlog_s / 3600.0,
        idle_found=sum(o.found_idle for o in outcomes),
        idle_reclaimed=sum(o.reclaimed for o in outcomes),
        idle_found_after_s=percentile(found_after, 50),
        idle_found_after_p90_s=percentile(found_after, 90),
        idle_reclaimed_after_s=percentile(reclaimed_after, 50),
        idle_reclaimed_after_p90_s=percentile(reclaimed_after, 90),
    )


# --- invariants ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """One job generation's hold on GPUs, from its BOUND event to its ending event (log order)."""

    job_id: str
    generation: int
    gpus: frozenset[tuple[str, int]]  # (node, GPU index) held whole


def double_holds(events: Iterable[tuple[str, str, int, frozenset[tuple[str, int]]]]) -> list[str]:
    """Replays (kind, job, generation, GPUs) in log order, kind 'bound' or 'ended'; returns each moment a GPU
    was bound to a job while another still held it (empty: the invariant held at every event)."""
    holder: dict[tuple[str, int], tuple[str, int]] = {}
    held_by: dict[tuple[str, int], frozenset[tuple[str, int]]] = {}
    problems = []
    for kind, job, generation, gpus in events:
        key = (job, generation)
        if kind == "bound":
            if key in held_by:
                continue  # a replayed BOUND of the same generation: the same hold
            for gpu in gpus:
                other = holder.get(gpu)
                if other is not None and other != key:
                    problems.append(f"{gpu[0]} GPU {gpu[1]}: bound to {job}/{generation} while {other[0]} held it")
                holder[gpu] = key
            held_by[key] = gpus
        else:
            for gpu in held_by.pop(key, frozenset()):
                if holder.get(gpu) == key:
                    del holder[gpu]
    return problems
