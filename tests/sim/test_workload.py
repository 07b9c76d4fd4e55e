import pytest

from kumiki.sim.trace import TraceJob
from kumiki.sim.workload import WorkloadError, featured_trace, sim_jobs, synthetic_jobs, without_pod_features


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


def test_featured_trace_repeats_scripts_under_fresh_names_and_stops_runs_at_their_limit():
    jobs = featured_trace(3000, total_gpus=32, seed=4)
    assert jobs == featured_trace(3000, total_gpus=32, seed=4), "seeded"
    assert len({job.model for job in jobs}) == len(jobs), "job names are generated afresh for every submission"
    scripts = {(job.queue, job.user, job.image, job.command) for job in jobs}
    assert len(scripts) < len(jobs) / 10, "the same scripts run again and again"
    limited = [job for job in jobs if job.time_limit_s is not None]
    assert 0.3 < len(limited) / len(jobs) < 0.9
    assert all(job.time_limit_s % 3600 == 0 and job.duration_s <= job.time_limit_s for job in limited)
    assert any(job.duration_s == job.time_limit_s for job in limited), "some runs reach the time they asked for"
    # within one (queue, GPUs) the scripts' run times differ by orders of magnitude: the key cannot tell them apart
    by_script: dict[str, list[float]] = {}
    for job in jobs:
        if job.queue == "team0" and job.gpus == 1:
            by_script.setdefault(job.command, []).append(job.duration_s)
    medians = sorted(sorted(runs)[len(runs) // 2] for runs in by_script.values() if len(runs) >= 5)
    assert medians[-1] / medians[0] > 30
    stripped = without_pod_features(jobs)
    assert all((job.image, job.command, job.time_limit_s) == ("", "", None) for job in stripped)
    assert [job.duration_s for job in stripped] == [job.duration_s for job in jobs]


def test_featured_trace_refuses_what_it_cannot_generate():
    with pytest.raises(WorkloadError, match="must be positive"):
        featured_trace(10, total_gpus=8, scripts_per_user=0)


def test_sim_jobs_carry_the_pod_features():
    (job,) = sim_jobs(featured_trace(1, total_gpus=8, seed=1), max_gpus=8)
    (source,) = featured_trace(1, total_gpus=8, seed=1)
    assert (job.image, job.command, job.time_limit_s) == (source.image, source.command, source.time_limit_s)
