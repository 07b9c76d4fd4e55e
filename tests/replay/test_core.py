"""The replay's pure rules: the jobs a trace becomes, the two queue trees, the report's figures, the
double-hold check."""

from __future__ import annotations

import pytest

from kumiki.quota.core import ANY_MODEL
from kumiki.replay.core import (
    Outcome,
    ReplayError,
    double_holds,
    guarantees,
    next_report_mark,
    percentile,
    plan_jobs,
    queue_tree,
    summarise,
)
from kumiki.sim.trace import TraceJob, load_jobs


def trace_job(job_id: str, submit_s: float | None, gpus: float, duration_s: float | None, queue: str = "a") -> TraceJob:
    return TraceJob(job_id, submit_s, gpus, None, None, duration_s, "", queue, "", "")


def test_plan_rebases_submit_times_and_shapes_gangs_like_the_simulator() -> None:
    jobs = plan_jobs(
        [trace_job("late", 500, 16, 10), trace_job("early", 100, 3, 20)], gpus_per_node=8, nodes=4, idle_fraction=0.0
    )
    assert [(job.job_id, job.submit_s, job.pods) for job in jobs] == [("early", 0.0, (3,)), ("late", 400.0, (8, 8))]
    assert not any(job.idle for job in jobs)


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (trace_job("x", None, 1, 10), "submit_s"),
        (trace_job("x", 0, 1, None), "duration_s"),
        (trace_job("x", 0, 0.5, 10), "gpus"),
        (trace_job("x", 0, 64, 10), "gpus"),
    ],
)
def test_plan_names_the_job_and_field_it_cannot_run(job: TraceJob, field: str) -> None:
    with pytest.raises(ReplayError, match=f"job x: field '{field}'"):
        plan_jobs([job], gpus_per_node=8, nodes=2)


def test_idle_jobs_follow_the_seed_and_fraction() -> None:
    trace = [trace_job(f"j{i}", i, 1, 10) for i in range(400)]
    first = plan_jobs(trace, gpus_per_node=8, nodes=1, idle_fraction=0.25, seed=3)
    again = plan_jobs(trace, gpus_per_node=8, nodes=1, idle_fraction=0.25, seed=3)
    assert [job.idle for job in first] == [job.idle for job in again]
    assert 60 <= sum(job.idle for job in first) <= 140
    with pytest.raises(ReplayError, match="--idle-fraction"):
        plan_jobs(trace, gpus_per_node=8, nodes=1, idle_fraction=1.0)


def test_static_tree_caps_each_queue_at_its_guarantee_but_never_below_its_largest_job() -> None:
    trace = [trace_job("a1", 0, 8, 10, "big"), trace_job("b1", 0, 11, 10, "small")]
    jobs = plan_jobs(trace, gpus_per_node=8, nodes=8)
    weights = {"big": 3.0, "small": 1.0}
    assert guarantees(jobs, 42, weights) == {"big": 31, "small": 10}
    static = queue_tree(jobs, 42, weights, static=True)
    assert static.queues["big"].limit_gpus == static.queues["big"].guaranteed_gpus == 31
    assert static.queues["small"].limit_gpus == 11  # its 11-GPU job could never run under 10
    with pytest.raises(ReplayError, match="--nodes: static quotas that hold each queue's largest job need 41 GPUs"):
        queue_tree(jobs, 40, weights, static=True)
    shared = queue_tree(jobs, 42, weights, static=False)
    assert all(queue.limit_gpus is None for queue in shared.queues.values())
    assert shared.queues["small"].guarantees == {ANY_MODEL: 10.0}


def test_summary_counts_allocation_only_while_jobs_wait() -> None:
    outcomes = [
        Outcome("a", "q", 8, submitted_s=0, bound_s=0, ended_s=100, idle=False),
        Outcome("b", "q", 8, submitted_s=0, bound_s=100, ended_s=200, idle=True),
    ]
    summary = summarise("kumiki", outcomes, planned=2, capacity_gpus=16)
    assert summary.avg_jct_s == 150 and summary.avg_queue_s == 50 and summary.makespan_s == 200
    assert summary.backlog_h == pytest.approx(100 / 3600)  # b waited 0..100
    assert summary.allocation_under_backlog == pytest.approx(0.5)  # 8 of 16 GPUs held while b waited
    assert summary.utilisation_under_backlog == pytest.approx(0.5)
    assert summary.idle_gpu_h == pytest.approx(8 * 100 / 3600)
    assert summary.jobs_per_gpu_h == pytest.approx(2 / (16 * 200 / 3600))
    assert percentile([5, 1, 3], 95) == 5
    assert summary.idle_found_after_s == summary.idle_reclaimed_after_s == 0  # nothing found, nothing reclaimed


def test_summary_reports_how_long_telemetry_took_to_find_the_zombies() -> None:
    outcomes = [
        Outcome(
            "a",
            "q",
            8,
            0,
            0,
            5000,
            idle=True,
            found_idle=2,
            found_after_s=(700.0, 1900.0),
            reclaimed=1,
            reclaimed_after_s=(400.0,),
        ),
        Outcome("b", "q", 1, 0, 0, 3000, idle=True, found_idle=1, found_after_s=(1200.0,)),
        Outcome("c", "q", 1, 0, 0, 3000, idle=False),
    ]
    summary = summarise("kumiki", outcomes, planned=3, capacity_gpus=16)
    assert summary.idle_found == 3
    assert (summary.idle_found_after_s, summary.idle_found_after_p90_s) == (1200.0, 1900.0)
    assert (summary.idle_reclaimed_after_s, summary.idle_reclaimed_after_p90_s) == (400.0, 400.0)


def test_double_holds_finds_a_gpu_bound_twice_and_accepts_reuse_after_release() -> None:
    gpu = frozenset({("n1", 0)})
    fine = [("bound", "a", 1, gpu), ("ended", "a", 1, gpu), ("bound", "b", 1, gpu), ("bound", "b", 1, gpu)]
    assert double_holds(fine) == []
    clash = [("bound", "a", 1, gpu), ("bound", "b", 1, gpu)]
    assert double_holds(clash) == ["n1 GPU 0: bound to b/1 while a held it"]


def test_bundled_excerpt_replays_on_the_default_cluster() -> None:
    jobs = plan_jobs(load_jobs("philly-replay"), gpus_per_node=8, nodes=16)
    assert len(jobs) == 523 and jobs[0].submit_s == 0
    assert max(job.duration_s for job in jobs) <= 6 * 3600


def test_settings_name_the_option_at_fault_before_anything_starts() -> None:
    from kumiki.replay.runner import ReplaySettings

    with pytest.raises(ReplayError, match="--trace: nosuch: no such file, and no bundled trace"):
        ReplaySettings(trace="nosuch").validate()
    with pytest.raises(ReplayError, match="--phases: expected some of baseline, kumiki, open, got later"):
        ReplaySettings(phases=("later",)).validate()
    with pytest.raises(ReplayError, match="--policy: expected one of"):
        ReplaySettings(policy="srtf-oracle").validate()
    ReplaySettings().validate()  # the defaults run


def test_a_preempted_job_waits_again_and_holds_only_while_bound() -> None:
    # a zombie held 16 GPUs 0..100, was reclaimed, waited, and held them again 300..400; b ran 100..300 meanwhile
    zombie = Outcome(
        "z", "q", 16, submitted_s=0, bound_s=0, ended_s=400, idle=True, runs=2, holds=((0, 100), (300, 400))
    )
    other = Outcome("b", "q", 16, submitted_s=50, bound_s=100, ended_s=300, idle=False)
    summary = summarise("kumiki", [zombie, other], planned=2, capacity_gpus=16)
    assert summary.idle_gpu_h == pytest.approx(16 * 200 / 3600)  # not 400 s: 100..300 it held nothing
    assert summary.backlog_h == pytest.approx(250 / 3600)  # b waited 50..100, then the zombie 100..300
    assert summary.allocation_under_backlog == pytest.approx(1.0)
    assert summary.utilisation_under_backlog == pytest.approx(200 / 250)  # computing only while b ran
    assert zombie.held_s == 200 and other.held == ((100, 300),)


def test_the_idle_rule_and_sampling_follow_the_speed() -> None:
    from kumiki.replay.runner import ReplaySettings, idle_rules, sample_interval_s

    assert idle_rules(600, 1000) == "default=5:0.6"
    assert sample_interval_s(600, 1000) == pytest.approx(0.15)  # four samples inside the rule's window
    assert sample_interval_s(600, 1) == 1.0  # real time: a sample a second, as the agent's default
    with pytest.raises(ReplayError, match="--idle-after-s: 10 trace seconds at --speed 1000 is under 50 ms"):
        ReplaySettings(idle_after_s=10).validate()
    with pytest.raises(ReplayError, match="--idle-after-s: expected 0 < s"):
        ReplaySettings(idle_after_s=-1).validate()


def test_a_reporting_job_reports_as_its_progress_doubles_from_half_an_hour_until_it_ends() -> None:
    assert next_report_mark(0.0, 10_000.0) == 1800.0
    assert next_report_mark(1800.0, 10_000.0) == 3600.0  # a mark reached is not reported again
    assert next_report_mark(5000.0, 10_000.0) == 7200.0  # resumed from a checkpoint past 3,600 s
    assert next_report_mark(7200.0, 10_000.0) is None  # 14,400 s is past its end
    assert next_report_mark(0.0, 1800.0) is None  # a job shorter than the first mark never reports
    with pytest.raises(ValueError, match="first_s must be > 0"):
        next_report_mark(0.0, 100.0, first_s=0.0)


def test_progress_reports_are_checked_by_option_name_for_the_replay_and_for_kumiki_up() -> None:
    import argparse

    from kumiki.cli.main import UsageError
    from kumiki.cli.replay import add_replay_options, settings_from

    for prefix in ("", "replay-"):
        parser = argparse.ArgumentParser()
        add_replay_options(parser, prefix=prefix)
        settings = settings_from(
            parser.parse_args([f"--{prefix}progress-reports", "8", f"--{prefix}seed", "3"]), prefix
        )
        assert settings.progress_reports is not None
        assert (settings.progress_reports.min_gpus, settings.progress_reports.seed) == (8, 3), "drawn with the seed"
        assert settings_from(parser.parse_args([]), prefix).progress_reports is None, "off by default"
        for wrong, message in (
            ([f"--{prefix}progress-reports", "0"], f"--{prefix}progress-reports must be >= 1"),
            ([f"--{prefix}progress-reports", "8", f"--{prefix}progress-share", "2"], "progress-share must be <= 1"),
            ([f"--{prefix}progress-reports", "8", f"--{prefix}progress-noise", "nan"], "progress-noise must be finite"),
        ):
            with pytest.raises(UsageError, match=message):
                settings_from(parser.parse_args(wrong), prefix)
