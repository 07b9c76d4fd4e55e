"""A job's result: its JCT runs from its submission to its finish, and its queueing is what of that it did not run
(waiting before its first start and between its attempts)."""

from __future__ import annotations

from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.jobs import JobResult, SimJobSpec


def test_queueing_is_the_jct_less_the_time_the_job_ran() -> None:
    result = JobResult("a", 8, "q", 100.0, 400.0, 2_000.0, 1_200.0, 1, 0.0, 0.0, 1_100.0)
    assert result.jct_s == 1_900.0 and result.queue_s == 700.0


def test_a_job_that_waits_for_another_queues_for_its_run() -> None:
    jobs = [SimJobSpec("first", 0.0, 8, 500.0), SimJobSpec("second", 10.0, 8, 300.0)]
    run = Simulator(uniform_cluster(1, 8), jobs, SimConfig(POLICIES["fifo"])).run()
    by_id = {job.job_id: job for job in run.jobs}
    assert by_id["first"].queue_s == 0.0 and by_id["second"].queue_s == 490.0
    assert by_id["second"].jct_s == 790.0 and by_id["second"].duration_s == 300.0
