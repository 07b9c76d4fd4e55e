"""Victim choice, pure: who yields when a waiting job needs room, the same code live and in the simulator.

Candidates are ordered by the work they would lose (seconds since their last acknowledged checkpoint, times
their GPUs), then by priority tier (lower first), then over-quota before within-quota, then by the queue
policy's rank (worse first). Never chosen: non-preemptible jobs, jobs of a higher tier than the waiting one,
and jobs that (re)started less than the minimum run time ago (no thrashing). This is the case kueue#477 and
KAI-Scheduler#904 leave open: two victims of equal priority, one checkpointed a minute ago and one with hours
of unsaved work; the first loses a minute, the second hours, so the first yields.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kumiki.sched.jobs import CheckpointModel


@dataclass(frozen=True, slots=True)
class LostWork:
    """What evicting a running job now would cost: progress since its last checkpoint (plus restore)."""

    since_checkpoint_s: float  # wall seconds of unsaved progress
    cost_s: float  # since_checkpoint_s plus the restore cost, what the policy weighs


def lost_work(
    job_id: str,
    started_s: float,
    executed_s: float,
    now: float,
    model: CheckpointModel,
    acknowledged: Mapping[str, float] | None,
) -> LostWork:
    """Unsaved work of a running job.

    `acknowledged` None (the simulator's periodic model): the job checkpoints every `model.interval_s` of
    progress, so it loses the progress since the last multiple. Otherwise (live, or the simulator's on-demand
    model) the wall time since its newest acknowledged checkpoint, or since it (re)started when none is newer.
    """
    if acknowledged is None:
        since = model.lost_progress(executed_s)
    else:
        since = max(0.0, now - max(started_s, acknowledged.get(job_id, started_s)))
    return LostWork(since, since + model.restore_cost_s)


class OnDemand(Mapping[str, float]):
    """`acknowledged` for the simulator's on-demand model: every job can write a checkpoint the moment it is asked
    (it answers within the deadline), so no work since its "last checkpoint" is at risk, only the restore."""

    def __getitem__(self, job_id: str) -> float:
        return math.inf

    def get(self, job_id: str, default: object = None) -> float:
        return math.inf

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def may_yield(
    victim_priority: int,
    victim_preemptible: bool,
    victim_started_s: float,
    waiting_priority: int,
    now: float,
    min_run_s: float,
) -> bool:
    """Whether a running job may be preempted for a waiting one at all (rank aside)."""
    return victim_preemptible and victim_priority <= waiting_priority and now - victim_started_s >= min_run_s


def victim_order(
    lost_gpu_s: float, priority: int, over_quota: bool, rank: float, job_id: str
) -> tuple[float, int, int, float, str]:
    """Sort key of a candidate victim: the cheapest to stop first (see the module docstring)."""
    return (lost_gpu_s, priority, 0 if over_quota else 1, -rank, job_id)
