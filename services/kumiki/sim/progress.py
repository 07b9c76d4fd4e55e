"""Where a job's progress stands under periodic checkpoints (`CheckpointModel`): the wall time from one progress
point to another, its inverse, and the last checkpoint below a point. A run checkpoints only below `until_s`
(the scheduler's `checkpoint_until`: a run nobody expects to preempt writes none past it)."""

from __future__ import annotations

import math

from kumiki.sched.jobs import CheckpointModel


def run_wall(checkpoint: CheckpointModel, start_s: float, end_s: float, until_s: float) -> float:
    """Wall seconds from one progress point to another, checkpointing only below `until_s`."""
    if until_s <= start_s:
        return end_s - start_s
    if end_s <= until_s:
        return checkpoint.wall_time(start_s, end_s)
    return checkpoint.wall_time(start_s, until_s) + (end_s - until_s)


def progress_after(checkpoint: CheckpointModel, start_s: float, wall_s: float, until_s: float) -> float:
    """Inverse of `run_wall`: progress reached after `wall_s` of running."""
    if until_s <= start_s:
        return start_s + wall_s
    if until_s == math.inf:
        return checkpoint.progress_after(start_s, wall_s)
    to_until = checkpoint.wall_time(start_s, until_s)
    if wall_s <= to_until:
        return min(checkpoint.progress_after(start_s, wall_s), until_s)
    return until_s + (wall_s - to_until)


def last_checkpoint(checkpoint: CheckpointModel, progress_s: float, until_s: float) -> float:
    """The last checkpoint written at or below `progress_s` (checkpoints only strictly below `until_s`)."""
    if progress_s >= until_s:
        return max(0.0, (math.ceil(until_s / checkpoint.interval_s) - 1) * checkpoint.interval_s)
    return checkpoint.checkpointed(progress_s)
