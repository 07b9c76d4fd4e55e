"""Synthetic distribution shifts of a job trace: what an unseen week may do to the forecasts (issue 14).

A shift changes the jobs of one queue submitted from the middle of the trace's submit span on, and nothing
else: no job is added, removed or moved in time, so a run with the shift and one without it differ only in
what the past can tell the forecaster about that queue.

- `x10`: the busiest queue's run times grow tenfold (a VC whose jobs change, say to a larger model);
- `new-vc`: the second busiest queue's jobs are renamed to a queue never seen before (no history of its own).

Both the forecaster's evaluation (`benchmarks/forecast_shifts.py`) and the scheduler's (`kumiki simulate
--shift`) read the same shifted trace from here.

A third stand-in moves jobs in time and changes nothing else: `reorder_days` builds another week from this one's
days in another order (`kumiki simulate --day-order`, `benchmarks/sim_spread.py --weeks`). Every day keeps its
jobs, their run times and their times of day, so what changes is what the forecaster has learnt when each day
comes and what is still running from the days before: the two things an unseen week of the same cluster changes.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kumiki.sim.trace import DAY_S, TraceJob

SHIFTS = ("x10", "new-vc")
NEW_QUEUE = "never-seen"
RUN_TIME_FACTOR = 10.0


class ShiftError(ValueError):
    """A shift that cannot be applied to this trace; the message says why."""


@dataclass(frozen=True, slots=True)
class ShiftedTrace:
    """The trace with the shift applied, and what changed: `queue` as named before the shift, from `from_s` on."""

    name: str
    queue: str
    from_s: float
    jobs: list[TraceJob]
    changed: frozenset[str]

    @property
    def target(self) -> str:
        """The shifted jobs' queue after the shift (the new VC's name, or the same queue)."""
        return NEW_QUEUE if self.name == "new-vc" else self.queue

    def describe(self) -> str:
        what = f"run times x{RUN_TIME_FACTOR:g}" if self.name == "x10" else f"renamed to {self.target!r}"
        return f"{self.name}: queue {self.queue!r} {what} from {self.from_s:g} s on ({len(self.changed)} jobs)"


def shift_trace(jobs: Sequence[TraceJob], name: str) -> ShiftedTrace:
    """Apply shift `name` (one of SHIFTS) to `jobs`, keeping their order."""
    if name not in SHIFTS:
        raise ShiftError(f"unknown shift {name!r} (known: {', '.join(SHIFTS)})")
    submits = [job.submit_s for job in jobs if job.submit_s is not None]
    if not submits:
        raise ShiftError("the trace has no submit times to find its middle")
    middle = (min(submits) + max(submits)) / 2.0
    by_size = [queue for queue, _ in Counter(job.queue for job in jobs).most_common()]
    rank = 0 if name == "x10" else 1
    if len(by_size) <= rank:
        raise ShiftError(f"shift {name} needs at least {rank + 1} queue(s); the trace has {len(by_size)}")
    queue = by_size[rank]
    if name == "new-vc" and NEW_QUEUE in by_size:
        raise ShiftError(f"shift new-vc renames a queue to {NEW_QUEUE!r}, which the trace already has")

    def shifted(job: TraceJob) -> TraceJob:
        if job.queue != queue or job.submit_s is None or job.submit_s < middle:
            return job
        if name == "x10":
            if job.duration_s is None:
                return job  # nothing to scale, and not counted as changed
            return dataclasses.replace(job, duration_s=job.duration_s * RUN_TIME_FACTOR)
        return dataclasses.replace(job, queue=NEW_QUEUE)

    out = [shifted(job) for job in jobs]
    changed = frozenset(new.job_id for new, old in zip(out, jobs, strict=True) if new is not old)
    return ShiftedTrace(name, queue, middle, out, changed)


# ---- another week from this one's days ------------------------------------------------------------------
def trace_days(jobs: Sequence[TraceJob]) -> int:
    """How many days the trace's submit times span (day 0 holds the first submit; days are whole UTC days)."""
    submits = [job.submit_s for job in jobs if job.submit_s is not None]
    if not submits:
        raise ShiftError("the trace has no submit times to cut into days")
    return int(max(submits) // DAY_S) - int(min(submits) // DAY_S) + 1


def reorder_days(jobs: Sequence[TraceJob], order: Sequence[int]) -> list[TraceJob]:
    """The trace with its days in `order`: day k of the result is day `order[k]` of `jobs` (0 = the first day).

    Each job moves by whole days, so it keeps its time of day, run time and everything else; the result is
    sorted by submit time. Jobs without a submit time stay as they are, at the end."""
    days = trace_days(jobs)
    if sorted(order) != list(range(days)):
        raise ShiftError(f"day order {list(order)} must list each of the trace's {days} days (0-{days - 1}) once")
    first = int(min(job.submit_s for job in jobs if job.submit_s is not None) // DAY_S)
    position = {old: new for new, old in enumerate(order)}

    def moved(job: TraceJob) -> TraceJob:
        if job.submit_s is None:
            return job
        day = int(job.submit_s // DAY_S) - first
        return dataclasses.replace(job, submit_s=job.submit_s + (position[day] - day) * DAY_S)

    timed = sorted((moved(job) for job in jobs if job.submit_s is not None), key=lambda job: job.submit_s or 0.0)
    return timed + [job for job in jobs if job.submit_s is None]


def day_orders(days: int, count: int, seed: int = 0) -> list[tuple[int, ...]]:
    """`count` distinct orders of `days` days, none the trace's own, drawn with `seed` (fewer if fewer exist)."""
    if days < 1 or count < 0:
        raise ShiftError(f"need at least one day and a count >= 0 (got {days} days, count {count})")
    draw = random.Random(seed)
    identity = tuple(range(days))
    possible = math.factorial(days)
    orders: list[tuple[int, ...]] = []
    while len(orders) < min(count, possible - 1):
        order = list(identity)
        draw.shuffle(order)
        candidate = tuple(order)
        if candidate != identity and candidate not in orders:
            orders.append(candidate)
    return orders


def parse_day_order(text: str) -> list[int]:
    """A day order as given on a command line, "3,6,5,2,0,4,1"."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ShiftError(f"day order {text!r} must be comma-separated day numbers, e.g. 3,6,5,2,0,4,1") from None
