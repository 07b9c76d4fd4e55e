"""The exact end-of-run checks of a replay, from job.lifecycle as it is in the log (no I/O here): what the
quota ledger must hold to the microsecond, each job run once and completed once, no GPU held by two jobs.

The fault-injection run (`kumiki.replay.faults`) and the live-replay test apply them to records they read
straight from the broker, so a service that lost, doubled or reordered something cannot hide it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from kumiki.common.contracts.v1 import events_pb2
from kumiki.replay.core import double_holds

OPENING = frozenset({events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING})
CLOSING = frozenset(
    {
        events_pb2.JOB_STATE_COMPLETED,
        events_pb2.JOB_STATE_FAILED,
        events_pb2.JOB_STATE_PREEMPTED,
        events_pb2.JOB_STATE_RELEASED,
    }
)


def at_micros(event: events_pb2.JobLifecycle) -> int:
    return event.at.seconds * 1_000_000 + event.at.nanos // 1000


def gpus_of(event: events_pb2.JobLifecycle) -> frozenset[tuple[str, int]]:
    return frozenset((a.node, int(index)) for a in event.assignments for index in a.gpu_indices)


def expected_ledger(events: Iterable[events_pb2.JobLifecycle]) -> dict[tuple[str, int], Decimal]:
    """GPU-seconds per (job, generation) as the quota ledger must meter them: from the first BOUND (or RUNNING)
    to the first ending after it, the job's own events in log order (one partition per job), each interval once.
    A generation still open at the end is not in the result."""
    opened: dict[tuple[str, int], tuple[int, Decimal]] = {}
    billed: dict[tuple[str, int], Decimal] = {}
    for event in events:
        key = (event.job.job_id, event.job.generation)
        if key in billed:
            continue
        if event.state in OPENING:
            opened.setdefault(key, (at_micros(event), Decimal(repr(event.gpus))))
        elif event.state in CLOSING and key in opened:
            start, gpus = opened.pop(key)
            billed[key] = gpus * Decimal(max(0, at_micros(event) - start)) / 1_000_000
    return billed


@dataclass(frozen=True)
class LifecycleVerdict:
    """What the log says about a set of jobs: problems (empty: every invariant held) and counts."""

    problems: list[str]
    completed: int
    generations: int
    preempted: int


def check_lifecycle(job_ids: Sequence[str], events: Sequence[events_pb2.JobLifecycle]) -> LifecycleVerdict:
    """Each job completed exactly once and never ran two generations at once, every bound generation ended, no
    event of a job after its completion, and no GPU bound to one job while another held it (the events replayed
    by their own time, endings first, as placement stamps a release before the bind that reuses its GPUs).
    `events`: the jobs' job.lifecycle records in log order."""
    wanted = set(job_ids)
    problems: list[str] = []
    completed: dict[str, int] = {}
    running: dict[str, int] = {}  # job -> generation bound and not yet ended
    bound: set[tuple[str, int]] = set()
    ended: set[tuple[str, int]] = set()
    after_completion: set[str] = set()
    preempted = 0
    for event in events:
        job, generation = event.job.job_id, event.job.generation
        if job not in wanted:
            continue
        if completed.get(job) and event.state in OPENING | CLOSING:
            after_completion.add(job)
        if event.state == events_pb2.JOB_STATE_BOUND:
            if (job, generation) in bound:
                continue  # a republished BOUND of the same generation: the same hold
            other = running.get(job)
            if other is not None and other != generation:
                problems.append(f"{job}: generation {generation} bound while generation {other} still held GPUs")
            bound.add((job, generation))
            running[job] = generation
        elif event.state in CLOSING:
            if (job, generation) in ended:
                continue
            ended.add((job, generation))
            if running.get(job) == generation:
                del running[job]
            if event.state == events_pb2.JOB_STATE_PREEMPTED:
                preempted += 1
            elif event.state == events_pb2.JOB_STATE_COMPLETED:
                completed[job] = completed.get(job, 0) + 1
            else:
                problems.append(f"{job}/{generation}: ended {events_pb2.JobState.Name(event.state)}, not COMPLETED")
    lost = sorted(wanted - set(completed))
    if lost:
        problems.append(f"{len(lost)} of {len(wanted)} jobs never completed: {', '.join(lost[:5])}")
    twice = sorted(job for job, count in completed.items() if count > 1)
    if twice:
        problems.append(f"{len(twice)} jobs completed more than once: {', '.join(twice[:5])}")
    if after_completion:
        problems.append(f"{len(after_completion)} jobs bound or ended again after completing: "
                        + ", ".join(sorted(after_completion)[:5]))  # fmt: skip
    open_ = sorted(f"{job}/{generation}" for (job, generation) in bound - ended)
    if open_:
        problems.append(f"{len(open_)} bound generations never ended: {', '.join(open_[:5])}")
    ours = [event for event in events if event.job.job_id in wanted]
    ordered = sorted(ours, key=lambda e: (at_micros(e), e.state == events_pb2.JOB_STATE_BOUND))
    timeline = (
        ("bound" if e.state == events_pb2.JOB_STATE_BOUND else "ended", e.job.job_id, e.job.generation, gpus_of(e))
        for e in ordered
        if e.state == events_pb2.JOB_STATE_BOUND or e.state in CLOSING
    )
    problems.extend(double_holds(timeline))
    return LifecycleVerdict(problems, sum(completed.values()), len(bound), preempted)
