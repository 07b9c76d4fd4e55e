"""Defragmentation moves (kumiki.sched.moves, through the Scheduler): a gang blocked only by fragmentation moves
small jobs off its nodes when its expected wait saved outweighs their lost work."""

from __future__ import annotations

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import RuntimeForecast
from kumiki.sched.jobs import JobView, consolidated_gang
from kumiki.sched.moves import plan_move
from kumiki.sched.policies import POLICIES
from kumiki.sched.scheduler import Scheduler
from tests.sched.helpers import view

HOUR = 3600.0
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
    move = plan_move(stale, "gang", now) if gang_at(stale, now) == [] else None
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
    assert plan_move(scheduler, "gang", now) is None
