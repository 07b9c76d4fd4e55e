"""Victim choice, pure: who yields when a waiting job needs room, the same code live and in the simulator.

Candidates are ordered by the work they would lose (seconds since their last acknowledged checkpoint, times
their GPUs), then by priority tier (lower first), then over-quota before within-quota, then by the queue
policy's rank (worse first). Never chosen: non-preemptible jobs, jobs of a higher tier than the waiting one,
and jobs that (re)started less than the minimum run time ago (no thrashing). This is the case kueue#477 and
KAI-Scheduler#904 leave open: two victims of equal priority, one checkpointed a minute ago and one with hours
of unsaved work; the first loses a minute, the second hours, so the first yields.

Defragmentation moves (`move_value`) use the same lost-work measure: small jobs leave the nodes a gang blocked
only by fragmentation needs when the gang's expected wait saved outweighs what they lose.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from kumiki.sched.jobs import CheckpointModel

# a preemption's reason as events and requests carry it ("idle-reclaim", "quota-reclaim", "priority"): a metric
# label and a lifecycle reason, so from outside only this shape, never free text
PREEMPTION_REASON = re.compile(r"[a-z][a-z-]{0,63}")


def reason_problem(text: str) -> str | None:
    """What is wrong with `text` as a preemption reason, None if nothing: the one message both ends give."""
    if PREEMPTION_REASON.fullmatch(text) is not None:
        return None
    return f"expected lowercase letters and hyphens (at most 64), got {text!r}"


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


def rescue_order(
    lost_gpu_s: float, priority: int, over_quota: bool, rank: float, job_id: str
) -> tuple[float, int, int, float, str]:
    """Sort key of a candidate victim of a starving job smaller than the largest node: the job the queue order
    values least first, then by tier, over-quota and lost work. The value is the order's index, 1 / rank
    (the completions a GPU-second given to the job is expected to buy); a node's victims cost the sum of theirs.

    The cheapest job to stop is usually the one that has just started, which the order ranks best: under
    overload, starving jobs rescued that way pushed short jobs out and then each other (the guard's own
    evictions were more than half of all), where taking the room from the jobs the order would run last keeps
    its gain (docs/design/0003-forecast-trust.md, eleventh step)."""
    index = 1.0 / rank if rank > 0 else math.inf
    return (index, priority, 0 if over_quota else 1, lost_gpu_s, job_id)


# ---- defragmentation: moving small jobs off the nodes a blocked gang needs ------------------------------------


@dataclass(frozen=True, slots=True)
class MoveValue:
    """Whether moving jobs off nodes pays for the gang they block, in GPU-seconds on both sides.

    Benefit: the gang's expected wait for those nodes to free up on their own (from the running jobs' expected
    remaining time, as the queue policy estimates it), less the handover (the moved jobs writing their
    checkpoint), times the gang's GPUs. Cost: each moved job's unsaved work since its last checkpoint plus its
    restore, and the handover, times its GPUs. Both sides move with the cluster (forecasts, checkpoint ages),
    so there is no threshold to tune: a move is made exactly when it is expected to gain more than it loses."""

    wait_saved_s: float
    gang_gpus: float
    lost_gpu_s: float  # the moved jobs' unsaved work plus restore, x their GPUs
    handover_gpu_s: float  # the moved jobs' GPUs held while they write their checkpoint

    @property
    def benefit_gpu_s(self) -> float:
        return self.wait_saved_s * self.gang_gpus

    @property
    def cost_gpu_s(self) -> float:
        return self.lost_gpu_s + self.handover_gpu_s

    @property
    def worth(self) -> bool:
        return self.benefit_gpu_s > self.cost_gpu_s


def move_value(
    expected_wait_s: float, handover_s: float, gang_gpus: float, moved: Sequence[tuple[LostWork, float]]
) -> MoveValue:
    """The value test of a defragmentation move; `moved`: (what each moved job loses, its GPUs)."""
    lost = sum(work.cost_s * gpus for work, gpus in moved)
    handover = sum(handover_s * gpus for _, gpus in moved)
    return MoveValue(max(0.0, expected_wait_s - handover_s), gang_gpus, lost, handover)
