import pytest

from kumiki.sim.trace import TraceJob
from kumiki.sim.workload import WorkloadError, sim_jobs, synthetic_jobs


def trace_job(job_id, submit=0.0, gpus=1.0, duration=10.0):
    return TraceJob(job_id, submit, gpus, None, None, duration, "", "q", "", "")


def test_sim_jobs_validates_fields_naming_the_job():
    with pytest.raises(WorkloadError, match="job a: field 'submit_s'"):
        sim_jobs([trace_job("a", submit=None)], max_gpus=8)
    with pytest.raises(WorkloadError, match="job b: field 'duration_s'"):
        sim_jobs([trace_job("b", duration=None)], max_gpus=8)
    with pytest.raises(WorkloadError, match="job c: field 'gpus' must be a whole number"):
        sim_jobs([trace_job("c", gpus=0.5)], max_gpus=8)
    with pytest.raises(WorkloadError, match="job d: field 'gpus' is 16"):
        sim_jobs([trace_job("d", gpus=16.0)], max_gpus=8)


def test_seed_orders_only_simultaneous_submissions():
    trace = [trace_job(f"j{i}", submit=float(i // 5)) for i in range(20)]
    plain = [job.job_id for job in sim_jobs(trace, max_gpus=8)]
    assert plain == [f"j{i}" for i in range(20)]  # seed 0: file order
    seeded = [job.job_id for job in sim_jobs(trace, max_gpus=8, seed=7)]
    assert seeded == [job.job_id for job in sim_jobs(trace, max_gpus=8, seed=7)]
    assert seeded != plain
    # submit order is kept across groups
    assert [int(j[1:]) // 5 for j in seeded] == sorted(int(j[1:]) // 5 for j in seeded)


def test_synthetic_jobs_are_seeded_and_fit_the_cluster():
    first = synthetic_jobs(500, total_gpus=8, seed=3)
    assert first == synthetic_jobs(500, total_gpus=8, seed=3)
    assert first != synthetic_jobs(500, total_gpus=8, seed=4)
    assert all(1 <= job.gpus <= 8 and job.duration_s >= 10 for job in first)
    assert [job.submit_s for job in first] == sorted(job.submit_s for job in first)
