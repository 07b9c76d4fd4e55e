"""Victim choice (kumiki.sched.preemption, through the Scheduler): lost work since the last acknowledged
checkpoint x GPUs first, then tier, then over-quota; never a higher tier, a non-preemptible job or one inside
its minimum run time. Defragmentation moves: a gang blocked only by fragmentation moves small jobs off its nodes
when its expected wait saved outweighs their lost work."""

from __future__ import annotations

import math

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import CheckpointModel, JobView, consolidated_gang
from kumiki.sched.policies import POLICIES
from kumiki.sched.preemption import lost_work, may_yield, rescue_order, victim_order
from kumiki.sched.scheduler import Scheduler

HOUR = 3600.0


def view(job_id: str, gpus: int, *, priority: int = 0, preemptible: bool = True, queue: str = "q") -> JobView:
    features = JobFeatures(job_id, queue, "", float(gpus), "", 0.0)
    return JobView(features, gpus, queue, 0.0, priority=priority, preemptible=preemptible)


def running_two(
    acknowledged: dict[str, float], *, min_run_s: float = 600.0, a: dict[str, object] | None = None, **second: object
) -> Scheduler:
    """`a` on node 0 and `b` on node 1 (4 of 4 GPUs each), both started at t=0 under the `kumiki` policy."""
    scheduler = Scheduler(
        POLICIES["kumiki"],
        ClusterState.empty(uniform_cluster(2, 4)),
        "best-fit",
        min_run_s=min_run_s,
        acknowledged=acknowledged,
    )
    scheduler.submit(view("a", 4, **(a or {})), consolidated_gang("a", 4, 4))  # type: ignore[arg-type]
    scheduler.submit(view("b", 4, **second), consolidated_gang("b", 4, 4))  # type: ignore[arg-type]
    assert sorted(start.job_id for start in scheduler.schedule(0.0).starts) == ["a", "b"]
    return scheduler


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

MINUTE = 60.0


def forecast_view(job_id: str, gpus: int, remaining_s: float | None = None, **fields: object) -> JobView:
    """A job the policy believes runs about `remaining_s` in all (None: no forecast)."""
    base = view(job_id, gpus, **fields)  # type: ignore[arg-type]
    if remaining_s is None:
        return base
    forecast = RuntimeForecast(remaining_s, remaining_s * 1.01, "test", 1)
    return JobView(base.features, gpus, base.queue, 0.0, base.priority, base.preemptible, forecast=forecast)


def fragmented(
    acknowledged: dict[str, float],
    *,
    policy: str = "kumiki-defrag",
    runs_s: float | None = None,
    nodes: int = 2,
    **fields: dict[str, object],
) -> Scheduler:
    """Two 4-GPU nodes, `a` (2 GPUs) on node 0 and `d` (2 GPUs) on node 1, both started at t=0 and believed to run
    `runs_s` in all; the jobs that shared their nodes have ended: 2 GPUs free on each, 4 in all, none together."""
    scheduler = Scheduler(
        POLICIES[policy], ClusterState.empty(uniform_cluster(nodes, 4)), "best-fit", acknowledged=acknowledged
    )
    for job_id in ("a", "b", "c", "d"):  # one by one: best-fit fills node 0 first
        scheduler.submit(forecast_view(job_id, 2, runs_s, **fields.get(job_id, {})), consolidated_gang(job_id, 2, 4))
        scheduler.schedule(0.0)
    assert [scheduler.running[job].nodes for job in "abcd"] == [(0,), (0,), (1,), (1,)]
    scheduler.finished("b")
    scheduler.finished("c")
    return scheduler


def gang_at(scheduler: Scheduler, now: float, gpus: int = 4, **fields: object) -> list[tuple[str, str]]:
    scheduler.submit(forecast_view("gang", gpus, **fields), consolidated_gang("gang", gpus, 4), now=now)  # type: ignore[arg-type]
    decisions = scheduler.schedule(now, consider_preemption=True)
    return [(preemption.job_id, preemption.reason) for preemption in decisions.preemptions]


def test_a_gang_blocked_by_fragmentation_moves_the_job_that_loses_least_and_starts_on_its_node() -> None:
    now = 3 * HOUR
    scheduler = fragmented({"a": now - MINUTE}, runs_s=6 * HOUR)  # d has three hours unsaved
    assert gang_at(scheduler, now) == [("a", "defragmentation")]
    assert scheduler.running["gang"].nodes == (0,)  # a's node, now whole
    # the moved job, queued again, goes where the gang's missing GPUs were
    scheduler.submit(forecast_view("a", 2, 6 * HOUR), consolidated_gang("a", 2, 4), now=now)
    assert [start.job_id for start in scheduler.schedule(now).starts] == ["a"]
    assert scheduler.running["a"].nodes == (1,)


def test_the_value_test_weighs_the_gangs_expected_wait_against_the_moved_jobs_unsaved_work() -> None:
    """Both jobs end in ten minutes (as forecast): 9 minutes x 4 GPUs saved. Moving one with three hours unsaved
    would lose 2 x 3 h: no move. The same job checkpointed a minute ago loses 2 x 3 min: it moves."""
    now = 3 * HOUR
    ends = now + 10 * MINUTE
    stale = fragmented({}, runs_s=ends)
    move = stale.defragmentation("gang", now) if gang_at(stale, now) == [] else None
    assert move is not None and not move[2].worth
    assert move[2].benefit_gpu_s == (10 * MINUTE - MINUTE) * 4  # wait saved past the handover, x the gang's GPUs
    assert move[2].cost_gpu_s == (3 * HOUR + MINUTE) * 2 + MINUTE * 2  # unsaved + restore, and the handover
    assert "gang" in stale.waiting and not stale.running.keys() & {"gang"}

    fresh = fragmented({"a": now - MINUTE, "d": now - MINUTE}, runs_s=ends)
    assert gang_at(fresh, now) == [("a", "defragmentation")]
    # and when the blocking jobs are about to end anyway, even a fresh checkpoint is not worth moving
    soon = fragmented({"a": now - MINUTE, "d": now - MINUTE}, runs_s=now + 2 * MINUTE)
    assert gang_at(soon, now) == []


def test_defragmentation_never_moves_non_preemptible_higher_tier_or_young_jobs() -> None:
    now = 3 * HOUR
    acknowledged = {"a": now - MINUTE, "d": now - MINUTE}
    pinned = fragmented(acknowledged, runs_s=6 * HOUR, a={"preemptible": False}, d={"priority": 1})
    assert gang_at(pinned, now) == []
    assert "gang" in pinned.waiting
    young = fragmented(acknowledged, runs_s=6 * HOUR)
    assert gang_at(young, 5 * MINUTE) == []  # both started 5 minutes ago: inside the minimum run time


def test_without_the_policy_flag_nothing_moves_and_the_gang_waits() -> None:
    now = 3 * HOUR
    scheduler = fragmented({"a": now - MINUTE}, policy="kumiki", runs_s=6 * HOUR)
    assert gang_at(scheduler, now) == []
    assert "gang" in scheduler.waiting


def test_a_multi_node_gang_takes_an_empty_node_and_one_freed_by_a_move() -> None:
    now = 3 * HOUR
    scheduler = fragmented({"a": now - MINUTE}, runs_s=6 * HOUR, nodes=3)  # node 2 is empty
    scheduler.submit(forecast_view("big", 4), consolidated_gang("big", 4, 4))  # fills node 2
    assert [start.job_id for start in scheduler.schedule(0.0).starts] == ["big"]
    scheduler.finished("big")
    assert gang_at(scheduler, now, gpus=8) == [("a", "defragmentation")]
    assert sorted(scheduler.running["gang"].nodes) == [0, 2]


def test_no_move_when_the_gangs_gpus_are_not_free_anywhere() -> None:
    """4 free GPUs in all: a 6-GPU gang is blocked by capacity, not fragmentation; moving would not help."""
    now = 3 * HOUR
    scheduler = fragmented({"a": now - MINUTE}, runs_s=6 * HOUR, nodes=2)
    scheduler.submit(forecast_view("gang", 8), consolidated_gang("gang", 8, 4), now=now)
    assert scheduler.defragmentation("gang", now) is None


def test_rescue_order_is_the_orders_value_then_lost_work() -> None:
    # the job the order values least (largest rank, smallest 1 / rank) goes first, however much it would lose
    assert rescue_order(5000.0, 0, False, 1e6, "long") < rescue_order(10.0, 0, False, 100.0, "short")
    assert rescue_order(10.0, 0, False, 100.0, "x") < rescue_order(20.0, 0, False, 100.0, "y")
    assert rescue_order(10.0, 0, False, 0.0, "zero")[0] == math.inf  # no rank: valued above every ranked job
    # a node's victims cost the sum of their values: two jobs ranked 200 cost as much as one ranked 100
    pair = rescue_order(0.0, 0, False, 200.0, "a")[0] + rescue_order(0.0, 0, False, 200.0, "b")[0]
    assert math.isclose(pair, rescue_order(0.0, 0, False, 100.0, "c")[0])


def test_a_job_that_fits_only_on_a_reserved_node_still_evicts_a_worse_ranked_job_elsewhere() -> None:
    """A starving two-node gang holds nodes 1 and 2 while they drain; node 0 is full with a long job. A short job that
    fits only the reserved nodes' free GPUs evicts the long job on node 0 by rank, as it would with no
    reservation (it used to wait for the drain: the free reserved GPUs hid it from preemption)."""
    scheduler = Scheduler(POLICIES["kumiki-noforecast"], ClusterState.empty(uniform_cluster(3, 4)), "best-fit")
    scheduler.submit(view("long", 4), consolidated_gang("long", 4, 4))
    assert [start.job_id for start in scheduler.schedule(0.0).starts] == ["long"]
    scheduler.submit(view("gang", 8), consolidated_gang("gang", 8, 4), now=HOUR)
    for job_id in ("d", "e"):  # submitted after the gang, they start on the nodes it cannot use yet
        scheduler.submit(view(job_id, 3), consolidated_gang(job_id, 3, 4), now=20 * HOUR)
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
