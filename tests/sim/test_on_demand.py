"""The simulator's on-demand checkpoint model (the live protocol): no periodic checkpoints, a victim checkpoints
when asked and loses only the acknowledgement time (the beneficiary waits that long), or past the deadline its
whole run. The same SRTF situation as test_engine's periodic case, so the two models can be read side by side."""

from __future__ import annotations

import pytest

from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import JobResult, SimConfig, SimJobSpec, Simulator
from kumiki.sim.scenarios import OnDemandCheckpoint

JOBS = [SimJobSpec("long", 0.0, 1, 10_000.0), SimJobSpec("short", 2_000.0, 1, 100.0)]


def run(on_demand: OnDemandCheckpoint) -> dict[str, JobResult]:
    config = SimConfig(POLICIES["srtf-oracle"], audit=True, on_demand=on_demand)
    result = Simulator(uniform_cluster(1, 1), JOBS, config).run()
    return {job.job_id: job for job in result.jobs}


def test_acknowledged_checkpoint_loses_only_the_acknowledgement_and_restore() -> None:
    jobs = run(OnDemandCheckpoint(deadline_s=300.0, ack_s=30.0))
    long, short = jobs["long"], jobs["short"]
    assert long.preemptions == 1 and long.checkpoint_gpu_s == 0.0  # no periodic writes
    assert long.lost_gpu_s == pytest.approx(30.0 + 60.0)
    assert short.finish_s == pytest.approx(2_000.0 + 30.0 + 100.0)  # waits for the ack
    # long: 10000 s of work, 2000 before; resumes at 2130 with a 60 s restore
    assert long.finish_s == pytest.approx(2_130.0 + 60.0 + 8_000.0)


def test_past_the_deadline_the_whole_run_is_lost() -> None:
    jobs = run(OnDemandCheckpoint(deadline_s=120.0, ack_s=500.0))
    long = jobs["long"]
    assert long.lost_gpu_s == pytest.approx(2_000.0 + 120.0 + 60.0)
    assert jobs["short"].finish_s == pytest.approx(2_000.0 + 120.0 + 100.0)
    assert long.finish_s == pytest.approx(2_220.0 + 60.0 + 10_000.0)


def test_invalid_model_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        OnDemandCheckpoint(deadline_s=-1.0)
