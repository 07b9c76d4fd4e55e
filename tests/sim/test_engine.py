import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import JobView, OracleJobView
from kumiki.sched.policies import KUMIKI_PROTECT_AFTER_S, POLICIES
from kumiki.sched.scheduler import Scheduler
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.report import summarize
from kumiki.sim.workload import featured_trace, sim_jobs
from tests.sim.forecasters import QueueMedianForecaster


def run(jobs, policy, nodes=2, gpus=4, audit=True, **config):
    forecaster = QueueMedianForecaster() if POLICIES[policy].uses_forecast else None
    simulator = Simulator(
        uniform_cluster(nodes, gpus), jobs, SimConfig(POLICIES[policy], audit=audit, **config), forecaster=forecaster
    )
    return simulator.run()


def test_single_job_runs_for_its_duration():
    result = run([SimJobSpec("a", 10.0, 2, 500.0)], "fifo")
    (job,) = result.jobs
    assert (job.first_start_s, job.finish_s, job.jct_s, job.queue_s) == (10.0, 510.0, 500.0, 0.0)


def test_preemptive_policy_pays_checkpoints_and_loses_work():
    # one GPU: a long job is running when a short one arrives; SRTF preempts it
    jobs = [SimJobSpec("long", 0.0, 1, 10_000.0), SimJobSpec("short", 2_000.0, 1, 100.0)]
    result = run(jobs, "srtf-oracle", nodes=1, gpus=1)
    by_id = {job.job_id: job for job in result.jobs}
    assert by_id["long"].preemptions == 1
    # preempted at 2000 s wall = 1940 s progress (one 60 s checkpoint at 1800): 140 s lost + 60 s restore
    assert by_id["long"].lost_gpu_s == pytest.approx(140.0 + 60.0)
    assert by_id["short"].finish_s == pytest.approx(2_100.0)
    # long: 10000 s work + 5 checkpoints (60 s each) + lost 140 s + restore 60 s + 100 s waiting for short
    assert by_id["long"].finish_s == pytest.approx(10_000 + 5 * 60 + 140 + 60 + 100)


def test_non_oracle_policies_receive_no_duration():
    captured: list[JobView] = []
    original = Scheduler.submit

    def spy(self, view, request, **kwargs):
        captured.append(view)
        return original(self, view, request, **kwargs)

    jobs = [SimJobSpec(f"j{i}", float(i * 50), 1 + i % 2, 1000.0 + i) for i in range(12)]
    Scheduler.submit = spy  # type: ignore[method-assign]
    try:
        for name, policy in POLICIES.items():
            captured.clear()
            run(jobs, name, nodes=1, gpus=2)
            assert captured
            if policy.oracle:
                assert all(isinstance(view, OracleJobView) for view in captured)
            else:
                assert all(type(view) is JobView for view in captured), name
    finally:
        Scheduler.submit = original  # type: ignore[method-assign]
    fields = {field.name for field in dataclasses.fields(JobView)}
    assert not {"duration_s", "remaining_s", "runtime_s"} & fields


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_first_decisions_do_not_depend_on_hidden_durations(policy):
    """Permute durations among identical-looking jobs: only oracles may start a different set at t=0."""
    durations = [100.0, 90_000.0, 5.0, 40_000.0, 700.0, 12.0, 3_000.0, 60_000.0]
    started_sets = set()
    for seed in range(4):
        shuffled = durations[:]
        random.Random(seed).shuffle(shuffled)
        jobs = [SimJobSpec(f"j{i}", 0.0, 1, duration) for i, duration in enumerate(shuffled)]
        result = run(jobs, policy, nodes=1, gpus=2)
        started_sets.add(frozenset(job.job_id for job in result.jobs if job.first_start_s == 0.0))
    if POLICIES[policy].oracle:
        assert len(started_sets) > 1
    else:
        assert len(started_sets) == 1


job_lists = st.lists(
    st.tuples(
        st.integers(0, 5_000),  # submit
        st.sampled_from([1, 1, 1, 2, 4, 8]),  # gpus
        st.integers(1, 20_000),  # duration
        st.sampled_from(["a", "b"]),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=25, deadline=None)
@given(
    specs=job_lists,
    policy=st.sampled_from(sorted(POLICIES)),
    nodes=st.integers(1, 3),
    gpus=st.sampled_from([4, 8]),
    placement=st.sampled_from(["best-fit", "spread", "first-fit", "kumiki"]),
)
def test_same_input_same_report_and_never_over_capacity(specs, policy, nodes, gpus, placement):
    jobs = [
        SimJobSpec(f"j{i}", float(submit), min(count, nodes * gpus), float(duration), queue)
        for i, (submit, count, duration, queue) in enumerate(specs)
    ]
    shares = {"a": float(gpus), "b": float(gpus)} if policy.startswith("kumiki") else None
    first = run(jobs, policy, nodes=nodes, gpus=gpus, placement=placement, queue_shares=shares)
    second = run(jobs, policy, nodes=nodes, gpus=gpus, placement=placement, queue_shares=shares)
    assert summarize(first) == summarize(second)
    assert [(j.job_id, j.finish_s) for j in first.jobs] == [(j.job_id, j.finish_s) for j in second.jobs]
    assert len(first.jobs) == len(jobs)  # every job finishes
    duration = {job.job_id: job.duration_s for job in jobs}
    for job in first.jobs:
        assert job.jct_s >= duration[job.job_id] - 1e-6
    assert all(0 <= sample.allocated_gpus <= nodes * gpus for sample in first.samples)
    busy = sum(job.run_wall_s * job.gpus for job in first.jobs)
    assert busy == pytest.approx(first.busy_gpu_s)


def test_kumiki_full_node_jobs_checkpoint_only_while_they_may_yield():
    interval = 1800.0
    # under `kumiki-protect` an 8-GPU job checkpoints only below KUMIKI_PROTECT_AFTER_S; a 1-GPU job all its run
    duration = 2 * KUMIKI_PROTECT_AFTER_S + 500.0
    (full,) = run([SimJobSpec("full", 0.0, 8, duration)], "kumiki-protect", nodes=1, gpus=8).jobs
    checkpoints = math.ceil(KUMIKI_PROTECT_AFTER_S / interval) - 1
    assert full.jct_s == pytest.approx(duration + checkpoints * 60.0)
    assert full.checkpoint_gpu_s == pytest.approx(checkpoints * 60.0 * 8)
    (single,) = run([SimJobSpec("single", 0.0, 1, duration)], "kumiki", nodes=1, gpus=8).jobs
    assert single.jct_s == pytest.approx(duration + math.floor(duration / interval) * 60.0)
    # `kumiki` keeps a full-node job preemptible, so it checkpoints all its run like a 1-GPU one
    (always,) = run([SimJobSpec("full", 0.0, 8, duration)], "kumiki", nodes=1, gpus=8).jobs
    assert always.jct_s == pytest.approx(duration + math.floor(duration / interval) * 60.0)
    (plain,) = run([SimJobSpec("full", 0.0, 8, duration)], "fifo", nodes=1, gpus=8).jobs
    assert plain.jct_s == duration


def test_pod_features_reach_the_forecaster():
    """The simulator hands the forecaster what a trace's pods carry (how much they are worth to the schedule is
    measured over seeds and loads by `benchmarks/pod_features.py`, not asserted here: it is not always positive)."""
    trace = featured_trace(300, total_gpus=16, load=1.2, seed=0)
    seen: list[JobFeatures] = []

    class Recording(QueueMedianForecaster):
        def predict(self, job: JobFeatures) -> RuntimeForecast:
            seen.append(job)
            return super().predict(job)

    Simulator(
        uniform_cluster(2, 8), sim_jobs(trace, max_gpus=16), SimConfig(POLICIES["kumiki"]), forecaster=Recording()
    ).run()
    by_id = {job.job_id: job for job in trace}
    assert len(seen) == len(trace)
    assert all(
        (job.image, job.command, job.time_limit_s)
        == (by_id[job.job_id].image, by_id[job.job_id].command, by_id[job.job_id].time_limit_s)
        for job in seen
    )
    assert any(job.time_limit_s for job in seen) and all(job.command for job in seen)


def test_a_starving_job_gets_its_turn_at_the_limit_even_when_the_trace_falls_silent():
    """Nothing arrives or ends for days: the pass that lets the starving whole-node job in runs at its starvation
    limit, as the live service's once-a-second pass would, not at the next event the trace happens to have."""
    day = 24 * 3600.0
    jobs = [SimJobSpec("long", 0.0, 8, 10 * day), SimJobSpec("waiter", 100.0, 8, 10 * day)]
    result = run(jobs, "kumiki-oracle", nodes=1, gpus=8)
    by_id = {job.job_id: job for job in result.jobs}
    assert by_id["waiter"].first_start_s == 100.0 + POLICIES["kumiki-oracle"].starvation_s
    # from then on the two take turns, each evicting the other when it has waited the limit
    assert by_id["long"].preemptions >= 1 and by_id["waiter"].preemptions >= 1
