"""Reservations: the nodes a blocked job is promised, and when they should have room for it.

A reservation holds the nodes expected to free up first (by the policy's estimate of the running jobs'
remaining time) for one blocked job; shorter jobs may borrow them until then (`Scheduler._try_place`). The
same estimate says when a node would have room on its own, which a defragmentation move is weighed against.
Reads the scheduler's state, changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kumiki.sched.placement import could_host
from kumiki.sched.policies import estimate_remaining

if TYPE_CHECKING:
    from kumiki.sched.scheduler import Scheduler, WaitingJob


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    nodes: frozenset[int]
    shadow_s: float  # when the reserved nodes are expected to have room: borrowers must end before it
    starving: bool = False


def room_at(scheduler: Scheduler, node: int, need: int, now: float, *, pessimistic: bool) -> float:
    """When `need` GPUs of a node are expected free on their own: its jobs leave in the order of their expected
    remaining run time as the policy estimates it (forecast, or the heavy-tail guess without one; `pessimistic`:
    the policy's upper estimate, which a reservation's borrowers are held to)."""
    free = scheduler.state.free_count(node)
    if free >= need:
        return now
    ends = []
    for job_id in scheduler.on_node[node]:
        running = scheduler.running[job_id]
        gpus = sum(len(pod.gpus) for pod in running.placement.pods if pod.node == node)
        remaining = estimate_remaining(
            scheduler.policy, running.view, scheduler.executed(running, now), pessimistic=pessimistic
        )
        ends.append((now + remaining, gpus))
    for end, gpus in sorted(ends):
        free += gpus
        if free >= need:
            return end
    return math.inf


def plan_reservation(
    scheduler: Scheduler, entry: WaitingJob, now: float, *, starving: bool = False
) -> Reservation | None:
    """The nodes that should free up first for `entry` (without estimates: the emptiest nodes); None when too
    few nodes could ever take it."""
    policy = scheduler.policy
    state = scheduler.state
    need, count = scheduler.span(entry.shape)
    candidates = []
    biggest = max(entry.request.pods, key=lambda pod: pod.gpu_demand)
    for node, spec in enumerate(state.spec.nodes):
        # nodes that could never take it (too small, another GPU model, no MIG or sharing, cordoned): useless
        if spec.gpus < need or node in state.cordoned or not could_host(spec, biggest):
            continue
        ready = room_at(scheduler, node, need, now, pessimistic=True) if policy.backfill_on_reserved else math.inf
        candidates.append((ready, -state.free_count(node), node))
    if len(candidates) < count:
        return None
    chosen = sorted(candidates)[:count]
    shadow = max(ready for ready, _, _ in chosen)
    return Reservation(entry.view.job_id, frozenset(node for _, _, node in chosen), shadow, starving)
