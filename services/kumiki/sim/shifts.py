"""Synthetic distribution shifts of a job trace: what an unseen week may do to the forecasts (issue 14).

A shift changes the jobs of one queue submitted from the middle of the trace's submit span on, and nothing
else: no job is added, removed or moved in time, so a run with the shift and one without it differ only in
what the past can tell the forecaster about that queue.

- `x10`: the busiest queue's run times grow tenfold (a VC whose jobs change, say to a larger model);
- `new-vc`: the second busiest queue's jobs are renamed to a queue never seen before (no history of its own).

Both the forecaster's evaluation (`benchmarks/forecast_shifts.py`) and the scheduler's (`kumiki simulate
--shift`) read the same shifted trace from here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kumiki.sim.trace import TraceJob

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
