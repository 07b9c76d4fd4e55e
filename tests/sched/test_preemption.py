"""Victim choice (kumiki.sched.preemption, through the Scheduler): lost work since the last acknowledged
checkpoint x GPUs first, then tier, then over-quota; never a higher tier, a non-preemptible job or one inside
its minimum run time."""

from __future__ import annotations

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import JobFeatures
from kumiki.sched.jobs import CheckpointModel, JobView, consolidated_gang
from kumiki.sched.policies import POLICIES
from kumiki.sched.preemption import lost_work, may_yield, victim_order
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
