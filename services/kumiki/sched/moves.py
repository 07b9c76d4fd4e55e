"""Defragmentation moves: small jobs leave the nodes a gang blocked only by fragmentation needs.

A gang whose GPUs are free but scattered would otherwise wait until its target nodes empty on their own. A move
checkpoints and evicts the cheapest small jobs there (they queue again and start elsewhere) when the gang's wait
saved outweighs their lost work (`kumiki.sched.preemption.move_value`). Planning reads the scheduler's state;
the dry run (`trial_move`) changes it and undoes every change before returning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kumiki.sched.cluster import Placement
from kumiki.sched.placement import PendingReason, could_host, place_gang
from kumiki.sched.policies import running_rank
from kumiki.sched.preemption import LostWork, MoveValue, lost_work, may_yield, move_value, victim_order
from kumiki.sched.reserving import room_at

if TYPE_CHECKING:
    from kumiki.sched.scheduler import Scheduler, WaitingJob

# a move: the gang's target nodes, the jobs to move off them with what each loses, and the value test
Move = tuple[frozenset[int], list[tuple[str, int, LostWork]], MoveValue]


def movable(
    scheduler: Scheduler, node: int, need: int, priority: int, now: float
) -> list[tuple[float, str, int, LostWork]]:
    """Jobs a defragmentation may move off a node, cheapest first: single-pod jobs smaller than the gang's
    pod (a job as large would need the very room that is missing), of no higher tier, preemptible, past
    their minimum run time and still checkpointing."""
    movable = []
    for job_id in scheduler.on_node[node]:
        running = scheduler.running[job_id]
        view = running.view
        if len(running.nodes) != 1 or len(running.request.pods) != 1 or running.gpus >= need:
            continue
        if not may_yield(view.priority, view.preemptible, running.start_s, priority, now, scheduler.min_run_s):
            continue
        executed = scheduler.executed(running, now)
        if executed >= scheduler.checkpoint_until(running.request, view):
            continue
        unsaved = lost_work(job_id, running.start_s, executed, now, scheduler.checkpoint, scheduler.acknowledged)
        attained = view.attained_gpu_s + running.gpus * (now - running.start_s)
        rank = running_rank(scheduler.policy, view, executed, attained)
        order = victim_order(unsaved.cost_s * running.gpus, view.priority, scheduler.over_quota(view), rank, job_id)
        movable.append((order, job_id, running.gpus, unsaved))
    movable.sort()
    return [(order[0], job_id, gpus, unsaved) for order, job_id, gpus, unsaved in movable]


def plan_move(scheduler: Scheduler, job_id: str, now: float) -> Move | None:
    """The cheapest move that would let a waiting gang blocked only by fragmentation start: (its target
    nodes, the jobs to move off them with what each loses, the value test). None: no such move (the gang's
    GPUs are not free anywhere, or nothing on the nodes may move). Pure: the state is not changed."""
    entry = scheduler.waiting[job_id]
    shape = entry.shape
    need, count = shape[0], len(shape)
    state = scheduler.state
    specs = state.spec.nodes
    cordoned = state.cordoned
    # fragmentation: the gang's GPUs are free, only not together
    if sum(state.free_count(node) for node in range(len(specs)) if node not in cordoned) < sum(shape):
        return None
    reserved = scheduler.reserved_for_others(job_id)
    biggest = max(entry.request.pods, key=lambda pod: pod.gpu_demand)
    usable = [
        node
        for node, spec in enumerate(specs)
        if spec.gpus >= need and node not in cordoned and node not in reserved and could_host(spec, biggest)
    ]
    if len(usable) < count:
        return None
    options: list[tuple[float, int, int, list[tuple[str, int, LostWork]]]] = []
    for node in usable:
        free = state.free_count(node)
        if free >= need:
            if count > 1:  # a node already free serves a multi-node gang as it is
                options.append((0.0, 0, node, []))
            continue
        chosen: list[tuple[str, int, LostWork]] = []
        cost = 0.0
        for victim_cost, victim, gpus, unsaved in movable(scheduler, node, need, entry.view.priority, now):
            if free >= need:
                break
            chosen.append((victim, gpus, unsaved))
            free += gpus
            cost += victim_cost
        if free >= need:
            options.append((cost, len(chosen), node, chosen))
    options.sort(key=lambda option: option[:3])
    picked = options[:count]
    if len(picked) < count or not any(option[3] for option in picked):
        return None
    moved = [victim for option in picked for victim in option[3]]
    expected = sorted(room_at(scheduler, node, need, now, pessimistic=False) for node in usable)[count - 1]
    # on demand (live, or the simulator's model) a moved job first writes its checkpoint; periodic: it stops
    handover_s = scheduler.checkpoint.checkpoint_cost_s if scheduler.acknowledged is not None else 0.0
    value = move_value(
        expected - now, handover_s, entry.request.gpu_demand, [(unsaved, gpus) for _, gpus, unsaved in moved]
    )
    return frozenset(option[2] for option in picked), moved, value


def trial_move(
    scheduler: Scheduler, entry: WaitingJob, targets: frozenset[int], moved: Sequence[str]
) -> Placement | None:
    """Dry run on the state, undone before returning: the gang's placement on `targets` once `moved` left,
    if it fits there and every moved job fits at once elsewhere (else the move only swaps who waits)."""
    state = scheduler.state
    outside = frozenset(range(len(state.spec.nodes))) - targets
    originals = [state.release(job_id) for job_id in moved]
    replaced: list[str] = []
    gang: Placement | None = None
    try:
        found = place_gang(state, entry.request, scheduler.strategy, excluded_nodes=outside, explain=False)
        if isinstance(found, PendingReason):
            return None
        state.allocate(found)
        gang = found
        for job_id in sorted(moved, key=lambda job: (-scheduler.running[job].gpus, job)):
            again = place_gang(
                state, scheduler.running[job_id].request, scheduler.strategy, excluded_nodes=targets, explain=False
            )
            if isinstance(again, PendingReason):
                return None
            state.allocate(again)
            replaced.append(job_id)
        return found
    finally:
        for job_id in replaced:
            state.release(job_id)
        if gang is not None:
            state.release(gang.job_id)
        for placement in originals:
            state.allocate(placement)
