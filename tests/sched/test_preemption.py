"""Victim choice (kumiki.sched.preemption, through the Scheduler): lost work since the last acknowledged
checkpoint x GPUs first, then tier, then over-quota; never a higher tier, a non-preemptible job or one inside
its minimum run time."""

from __future__ import annotations

import math

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import JobFeatures
from kumiki.sched.jobs import CheckpointModel, JobView, consolidated_gang
from kumiki.sched.policies import POLICIES
from kumiki.sched.preemption import lost_work, may_yield, rescue_order, victim_order
from kumiki.sched.scheduler import Scheduler
from tests.sched.helpers import running_two, view

HOUR = 3600.0


def urgent_at(scheduler: Scheduler, now: float) -> list[tuple[str, str]]:
    scheduler.submit(view("urgent", 4, priority=1), consolidated_gang("urgent", 4, 4), now=now)
    decisions = scheduler.schedule(now, consider_preemption=True)
    return [(preemption.job_id, preemption.reason) for preemption in decisions.preemptions]


def test_kueue_477_equal_priority_the_one_checkpointed_a_minute_ago_yields() -> None:
    """Two victims of equal priority: `a` checkpointed a minute ago, `b` has three hours unsaved."""
    now = 3 * HOUR
    scheduler = running_two({"a": now - 60.0})
    assert urgent_at(scheduler, now) == [("a", "priority")]
    assert scheduler.running["urgent"].nodes == (0,)  # a's node


def test_the_other_way_round_the_other_job_yields_and_the_decision_carries_its_lost_work() -> None:
    now = 3 * HOUR
    scheduler = running_two({"b": now - 60.0})
    scheduler.submit(view("urgent", 4, priority=1), consolidated_gang("urgent", 4, 4), now=now)
    (preemption,) = scheduler.schedule(now, consider_preemption=True).preemptions
    assert preemption.job_id == "b" and preemption.for_job == "urgent"
    assert preemption.since_checkpoint_s == 60.0 and preemption.lost_gpu_s == 240.0


def test_never_a_non_preemptible_job_nor_one_inside_its_minimum_run_time() -> None:
    now = 3 * HOUR
    # b has far less unsaved work but is not preemptible: a yields
    assert urgent_at(running_two({"b": now - 1.0}, preemptible=False), now) == [("a", "priority")]
    both = running_two({}, a={"preemptible": False}, preemptible=False)
    assert urgent_at(both, now) == []  # nothing may yield: the urgent job waits
    young = running_two({}, min_run_s=2 * HOUR)
    assert urgent_at(young, HOUR) == []  # both started an hour ago, the minimum is two


def test_a_lower_tier_never_preempts_a_higher_one() -> None:
    scheduler = running_two({}, priority=2)
    scheduler.running.pop("a")  # only b (tier 2) could make room
    scheduler.state.release("a")
    scheduler.on_node[0].discard("a")
    scheduler.submit(view("big", 8, priority=1), consolidated_gang("big", 8, 8))
    assert scheduler.schedule(HOUR, consider_preemption=True).preemptions == []


def test_lost_work_live_counts_from_the_newest_acknowledged_checkpoint_or_the_start() -> None:
    model = CheckpointModel(interval_s=1800.0, restore_cost_s=60.0)
    assert lost_work("j", 100.0, 900.0, 1000.0, model, {"j": 700.0}).since_checkpoint_s == 300.0
    assert lost_work("j", 100.0, 900.0, 1000.0, model, {}).since_checkpoint_s == 900.0
    assert lost_work("j", 100.0, 900.0, 1000.0, model, {"j": 50.0}).since_checkpoint_s == 900.0  # an older attempt's
    periodic = lost_work("j", 0.0, 2000.0, 2000.0, model, None)  # the simulator's periodic model
    assert (periodic.since_checkpoint_s, periodic.cost_s) == (200.0, 260.0)


def test_order_is_lost_work_then_tier_then_over_quota_then_rank() -> None:
    assert victim_order(10.0, 5, False, 1.0, "x") < victim_order(20.0, 0, True, 9.0, "y")
    assert victim_order(10.0, 0, False, 1.0, "x") < victim_order(10.0, 1, True, 9.0, "y")
    assert victim_order(10.0, 0, True, 1.0, "x") < victim_order(10.0, 0, False, 9.0, "y")
    assert victim_order(10.0, 0, True, 9.0, "y") < victim_order(10.0, 0, True, 1.0, "x")
    assert may_yield(0, True, 0.0, 1, 700.0, 600.0)
    assert not may_yield(0, True, 200.0, 1, 700.0, 600.0)
    assert not may_yield(2, True, 0.0, 1, 700.0, 600.0)
    assert not may_yield(0, False, 0.0, 1, 700.0, 600.0)


# ---- defragmentation ------------------------------------------------------------------------------------------


def test_rescue_order_is_the_orders_value_then_lost_work() -> None:
    # the job the order values least (largest rank, smallest 1 / rank) goes first, however much it would lose
    assert rescue_order(5000.0, 0, False, 1e6, "long") < rescue_order(10.0, 0, False, 100.0, "short")
    assert rescue_order(10.0, 0, False, 100.0, "x") < rescue_order(20.0, 0, False, 100.0, "y")
    assert rescue_order(10.0, 0, False, 0.0, "zero")[0] == math.inf  # no rank: valued above every ranked job
    # a node's victims cost the sum of their values: two jobs ranked 200 cost as much as one ranked 100
    pair = rescue_order(0.0, 0, False, 200.0, "a")[0] + rescue_order(0.0, 0, False, 200.0, "b")[0]
    assert math.isclose(pair, rescue_order(0.0, 0, False, 100.0, "c")[0])


def test_a_job_that_fits_only_on_a_reserved_node_still_evicts_a_worse_ranked_job_elsewhere() -> None:
    """A starving two-node gang holds nodes 1 and 2 while they drain (their jobs may not be preempted, so it cannot
    clear them); node 0 is full with a long job. A short job that fits only the reserved nodes' free GPUs evicts the
    long job on node 0 by rank, as it would with no reservation (it used to wait for the drain: the free reserved
    GPUs hid it from preemption)."""
    scheduler = Scheduler(POLICIES["kumiki-noforecast"], ClusterState.empty(uniform_cluster(3, 4)), "best-fit")
    scheduler.submit(view("long", 4), consolidated_gang("long", 4, 4))
    assert [start.job_id for start in scheduler.schedule(0.0).starts] == ["long"]
    scheduler.submit(view("gang", 8), consolidated_gang("gang", 8, 4), now=HOUR)
    for job_id in ("d", "e"):  # submitted after the gang, they start on the nodes it cannot use yet
        scheduler.submit(view(job_id, 3, preemptible=False), consolidated_gang(job_id, 3, 4), now=20 * HOUR)
    assert sorted(start.job_id for start in scheduler.schedule(20 * HOUR).starts) == ["d", "e"]
    # the gang starves; without forecasts it reserves the emptiest nodes, d's and e's (one GPU free on each)
    now = 25.5 * HOUR
    scheduler.schedule(now)
    reservation = scheduler.reservation
    assert reservation is not None and reservation.job_id == "gang" and reservation.starving
    assert reservation.nodes == frozenset({1, 2})
    features = JobFeatures("short", "q", "", 1.0, "", now)
    scheduler.submit(JobView(features, 1, "q", now), consolidated_gang("short", 1, 4), now=now)
    decisions = scheduler.schedule(now, consider_preemption=True)
    assert [(p.job_id, p.for_job, p.reason) for p in decisions.preemptions] == [("long", "short", "rank")]
    assert [start.job_id for start in decisions.starts] == ["short"]
    assert scheduler.running["short"].nodes == (0,)
    assert scheduler.state.free_count(1) == 1 and scheduler.state.free_count(2) == 1  # the drain is untouched
