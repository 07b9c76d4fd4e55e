"""Victim search: which running jobs one node's room comes from when a blocked job may preempt.

A job that fits one node (a gang too, when its pods fit a node together) may evict jobs that rank worse than it
by the policy's margin (`preempt_margin`), jobs of a lower priority tier, or, starving, anyone who may yield. Per
node, victims are taken cheapest first (`victim_order`: the work they would lose) until the node has room, and
the node losing least wins. A gang over several nodes evicts only when starving, and then on as many nodes as it
needs, those losing least. Reads the scheduler's state, changes nothing: the pass evicts what this returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kumiki.sched.policies import LEVEL_SPAN_S, preempt_margin, running_rank
from kumiki.sched.preemption import lost_work, may_yield, rescue_order, victim_order

if TYPE_CHECKING:
    from kumiki.sched.scheduler import Scheduler, WaitingJob

# a chosen victim: (job, unsaved GPU-seconds, unsaved seconds, reason)
VictimChoice = tuple[str, float, float, str]


def choose_victims(
    scheduler: Scheduler,
    entry: WaitingJob,
    now: float,
    *,
    force: bool = False,
    nodes: Sequence[int] | None = None,
) -> list[VictimChoice]:
    """The jobs to evict to free one node for `entry`, losing the least work (only on `nodes` if given); empty
    when no node can be freed. `force`: the job is starving, so rank margins do not apply, and a gang that needs
    several nodes has the ones that lose least cleared (without that a starving gang waited for its reserved
    nodes to drain on their own, days behind a long one-GPU job, and held the guard from every other job)."""
    need, count = scheduler.span(entry.shape)
    if count > 1 and not force:
        return []  # multi-node gangs get reservations, not rank preemption cascades
    rank = entry.key[0]
    reserved = scheduler.reserved_for_others(entry.view.job_id)
    policy = scheduler.policy
    checkpoint = scheduler.checkpoint
    running_jobs = scheduler.running
    min_run_s = scheduler.min_run_s
    acknowledged = scheduler.acknowledged
    priority = entry.view.priority
    # a starving job smaller than the largest node takes its room from the jobs the order values least
    sort_key = rescue_order if force and policy.starvation_by_rank and need < scheduler.state.max_gpus else victim_order
    cleared: list[tuple[float, int, list[VictimChoice]]] = []
    specs = scheduler.state.spec.nodes
    for node in range(len(specs)) if nodes is None else nodes:
        if specs[node].gpus < need or node in reserved:
            continue
        free = scheduler.state.free_count(node)
        if free >= need:  # no victims to look for here
            if count > 1:
                cleared.append((0.0, node, []))  # a gang's other nodes may have room already
            continue
        victims: list[tuple[tuple[float, int, int, float, str], str, int, float, float, str]] = []
        for job_id in scheduler.on_node[node]:
            running = running_jobs[job_id]
            view = running.view
            if not may_yield(view.priority, view.preemptible, running.start_s, priority, now, min_run_s):
                continue
            executed = running.view.executed_s + (now - running.start_s)
            if executed >= scheduler.checkpoint_until(running.request, running.view) and not scheduler.young_full_node(
                running, executed
            ):
                continue
            attained = running.view.attained_gpu_s + running.gpus * (now - running.start_s)
            victim_rank = running_rank(policy, running.view, executed, attained)
            unsaved = lost_work(job_id, running.start_s, executed, now, checkpoint, acknowledged)
            lost = unsaved.cost_s
            reason = "starvation" if force else "priority" if view.priority < priority else "rank"
            if force or view.priority < priority:
                worse = True
            elif policy.order == "las":
                worse = victim_rank > rank
            elif policy.order == "las-forecast":
                # preempt only across levels, as Tiresias: the forecast orders jobs, it does not evict
                worse = victim_rank // LEVEL_SPAN_S > rank // LEVEL_SPAN_S
            else:
                weight = running.gpus**policy.gpu_exponent if policy.gpu_exponent else 1.0
                margin = preempt_margin(policy, entry.view, view, executed)
                worse = victim_rank > margin * rank + lost * weight
            if worse:
                lost_gpu_s = lost * running.gpus
                order = sort_key(lost_gpu_s, view.priority, scheduler.over_quota(view), victim_rank, job_id)
                since = unsaved.since_checkpoint_s
                victims.append((order, job_id, running.gpus, since * running.gpus, since, reason))
        if free + sum(victim[2] for victim in victims) < need:
            continue
        victims.sort()
        freed = free
        chosen: list[VictimChoice] = []
        cost = 0.0
        for order, job_id, gpus, lost_gpu_s, since, reason in victims:
            if freed >= need:
                break
            chosen.append((job_id, lost_gpu_s, since, reason))
            freed += gpus
            cost += order[0]
        cleared.append((cost, node, chosen))
    if len(cleared) < count:
        return []
    return [victim for _, _, chosen in sorted(cleared)[:count] for victim in chosen]
