"""Reservations (kumiki.sched.reserving): when a node has room by the policy's estimates of its running jobs,
and which nodes a blocked job is promised."""

from __future__ import annotations

import math

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import JobView, consolidated_gang
from kumiki.sched.policies import POLICIES
from kumiki.sched.reserving import plan_reservation, room_at
from kumiki.sched.scheduler import Scheduler


def forecast_view(job_id: str, gpus: int, p50: float, p90: float) -> JobView:
    features = JobFeatures(job_id, "q", "", float(gpus), "", 0.0)
    return JobView(features, gpus, "q", 0.0, forecast=RuntimeForecast(p50, p90, "test", 1))


def three_nodes(policy: str = "kumiki") -> Scheduler:
    """Three 4-GPU nodes: `a` fills node 0 (p50 1,000 s, p90 2,000 s); `b` (2 GPUs, p50 3,000 s, p90 4,000 s) and
    `c` (2 GPUs, p50 500 s, p90 600 s) share node 1; node 2 is empty. All started at t=0."""
    scheduler = Scheduler(POLICIES[policy], ClusterState.empty(uniform_cluster(3, 4)), "best-fit")
    for job_id, gpus, p50, p90 in (("a", 4, 1000.0, 2000.0), ("b", 2, 3000.0, 4000.0), ("c", 2, 500.0, 600.0)):
        scheduler.submit(forecast_view(job_id, gpus, p50, p90), consolidated_gang(job_id, gpus, 4))
        scheduler.schedule(0.0)
    assert [scheduler.running[job].nodes for job in "abc"] == [(0,), (1,), (1,)]
    return scheduler


def test_a_node_has_room_when_enough_of_its_jobs_are_expected_to_have_left() -> None:
    scheduler = three_nodes()
    assert room_at(scheduler, 2, 4, 0.0, pessimistic=False) == 0.0  # already free
    assert room_at(scheduler, 1, 2, 0.0, pessimistic=False) == 500.0  # c leaves first
    assert room_at(scheduler, 1, 4, 0.0, pessimistic=False) == 3000.0  # and b after it
    # the pessimistic estimate (what borrowers of a reservation are held to) reads the p90s
    assert room_at(scheduler, 1, 2, 0.0, pessimistic=True) == 600.0
    assert room_at(scheduler, 1, 4, 0.0, pessimistic=True) == 4000.0
    # time run counts: at t=100, b still has its p50 minus 100 s to go
    assert room_at(scheduler, 1, 4, 100.0, pessimistic=False) == 3000.0
    assert room_at(scheduler, 0, 8, 0.0, pessimistic=False) == math.inf  # more than the node has


def test_a_gang_is_promised_the_nodes_that_free_up_first_and_borrowers_must_leave_by_the_last() -> None:
    scheduler = three_nodes()
    scheduler.submit(forecast_view("gang", 8, 9000.0, 9000.0), consolidated_gang("gang", 8, 4))
    reservation = plan_reservation(scheduler, scheduler.waiting["gang"], 0.0)
    assert reservation is not None and reservation.job_id == "gang" and not reservation.starving
    assert reservation.nodes == frozenset({0, 2})  # node 2 now, node 0 at a's p90; node 1 only at b's
    assert reservation.shadow_s == 2000.0


def test_without_estimates_the_emptiest_nodes_are_reserved() -> None:
    scheduler = three_nodes("fifo-backfill")  # no forecasts read: every running job's end is unknown
    scheduler.submit(forecast_view("gang", 8, 9000.0, 9000.0), consolidated_gang("gang", 8, 4))
    reservation = plan_reservation(scheduler, scheduler.waiting["gang"], 0.0, starving=True)
    assert reservation is not None and reservation.starving
    assert 2 in reservation.nodes and reservation.shadow_s == math.inf


def test_no_reservation_when_too_few_nodes_could_ever_take_the_job() -> None:
    scheduler = three_nodes()
    scheduler.state.cordoned = frozenset({1})
    scheduler.submit(forecast_view("gang", 12, 9000.0, 9000.0), consolidated_gang("gang", 12, 4))
    assert plan_reservation(scheduler, scheduler.waiting["gang"], 0.0) is None
