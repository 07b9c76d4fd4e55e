"""The replay's report: each phase set against its simulated twin, run with the same queue tree."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.replay.core import plan_jobs, queue_tree
from kumiki.replay.report import ROWS, markdown
from kumiki.replay.runner import Endpoints, ReplaySettings, _twin_idle, simulate_counterpart, vc_weights
from kumiki.sched.idle import IdlePolicy, parse_idle_reclaim
from kumiki.sim.scenarios import IdleReclaim
from kumiki.sim.trace import load_jobs


def results(live: dict[str, float], twins: dict[str, Any]) -> dict[str, Any]:
    def phase(avg_jct_s: float) -> dict[str, Any]:
        summary = {key: 1.0 for _, key, _ in ROWS}
        return {"policy": "kumiki", "summary": {**summary, "avg_jct_s": avg_jct_s}, "problems": []}

    return {
        "trace": "philly-replay",
        "jobs": 10,
        "idle_jobs": 0,
        "nodes": 2,
        "gpus_per_node": 8,
        "speed": 1000.0,
        "phases": {name: phase(jct) for name, jct in live.items()},
        "simulated_phases": twins,
    }


def test_each_phase_is_set_against_its_twin_and_a_failed_twin_says_why() -> None:
    text = markdown(
        results(
            {"baseline": 3_000.0, "kumiki": 1_100.0},
            {"baseline": {"avg_jct_s": 2_500.0}, "kumiki": {"error": "simulation failed: ValueError('x')"}},
        )
    )
    assert "| baseline | 3,000 | 2,500 | +20.0% |" in text
    assert "| kumiki |" not in text.split("its simulated twin")[1]
    assert "Simulated kumiki: simulation failed: ValueError('x')" in text


def test_the_static_twin_holds_each_queue_to_its_quota_as_the_baseline_phase_does() -> None:
    jobs = plan_jobs(load_jobs("philly-replay"), gpus_per_node=8, nodes=16)
    static = queue_tree(jobs, 128, vc_weights(), static=True)
    open_run = simulate_counterpart(jobs, 16, "fifo", "best-fit")
    capped = simulate_counterpart(jobs, 16, "fifo", "best-fit", quota=static)
    assert capped["avg_jct_s"] > 2 * open_run["avg_jct_s"]  # capped at their guarantees, queues wait for their own


def test_the_twin_has_the_replays_zombies_and_reclaims_them_by_placements_rule() -> None:
    jobs = plan_jobs(load_jobs("philly-replay"), gpus_per_node=8, nodes=10, idle_fraction=0.1)
    assert sum(job.idle for job in jobs) > 20
    rule = IdleReclaim(600.0, parse_idle_reclaim("*=waiting:0"))
    kept = simulate_counterpart(jobs, 10, "kumiki-noforecast", "best-fit")
    reclaimed = simulate_counterpart(jobs, 10, "kumiki-noforecast", "best-fit", idle=rule)
    assert kept["idle_reclaimed"] == 0 < reclaimed["idle_reclaimed"]
    assert reclaimed["avg_jct_s"] != kept["avg_jct_s"]
    text = markdown(
        results(
            {"baseline": 3_000.0, "kumiki": 1_100.0},
            {"baseline": {"avg_jct_s": 2_500.0, "idle_reclaimed": 0}, "kumiki": {"avg_jct_s": 1_000.0}},
        )
    )
    assert "| baseline | 3,000 | 2,500 | +20.0% | 1 / n/a | 1 / 0 |" in text  # live's count: the summary's 1.0
    assert "| kumiki | 1,100 | 1,000 | +10.0% | 1 / n/a | 1 / n/a |" in text  # a results file from before
    assert "as late as its live phase did" not in text  # neither twin says which delay it was given
    none_found = results({"baseline": 3_000.0, "kumiki": 1_100.0}, {})
    none_found["phases"]["baseline"]["summary"]["idle_found_after_s"] = 0.0
    assert "| telemetry found a zombie after (s, median) | - | 1 | - |" in markdown(none_found)  # no delay, no ratio


def test_the_report_sets_zombies_found_side_by_side_and_says_when_each_twin_found_them() -> None:
    twin = {"avg_jct_s": 1_000.0, "idle_found": 7, "idle_reclaimed": 4, "idle_found_after_s": 1_253.0}
    data = results({"kumiki": 1_100.0}, {"kumiki": twin})
    data["phases"]["kumiki"]["summary"].update(idle_found=9, idle_reclaimed=5, idle_found_after_s=1_253.0)
    text = markdown(data)
    assert "| kumiki | 1,100 | 1,000 | +10.0% | 9 / 7 | 5 / 4 |" in text
    assert "| telemetry found a zombie after (s, median) | 1,253 |" in text
    assert "as late as its live phase did (the median, from the bind to telemetry's finding: kumiki 1,253 s)" in text


def test_each_twin_takes_its_phases_idle_rule() -> None:
    settings = ReplaySettings(idle_after_s=900.0)
    endpoints = Endpoints("127.0.0.1:1", KafkaSettings(), DatabaseSettings(), placement_idle_reclaim="*=after:60")
    assert _twin_idle("baseline", settings, endpoints) == IdleReclaim(900.0, {})  # today's cluster: never
    assert _twin_idle("kumiki", settings, endpoints) == IdleReclaim(900.0, {"*": IdlePolicy("after", 60.0)})
    # as late as the live phase found its zombies (the rule's own duration at the least)
    assert _twin_idle("kumiki", settings, endpoints, 1_250.0).found_after_s == 1_250.0
    assert _twin_idle("kumiki", settings, endpoints, 850.0).found_after_s == 900.0
    # never, where the nodes send no samples (KWOK): the twin neither finds nor reclaims
    never = _twin_idle("kumiki", settings, endpoints, math.inf)
    assert never.due_after_s("any") is None
    jobs = plan_jobs(load_jobs("philly-replay"), gpus_per_node=8, nodes=10, idle_fraction=0.1)
    twin = simulate_counterpart(jobs, 10, "kumiki-noforecast", "best-fit", idle=never)
    assert (twin["idle_found"], twin["idle_reclaimed"], twin["idle_found_after_s"]) == (0, 0, None)
    data = results({"kumiki": 1_100.0}, {"kumiki": {**twin, "avg_jct_s": 1_000.0}})
    assert "nor does a twin" in markdown(data) and "as late as" not in markdown(data)
    with pytest.raises(ValueError, match="'\\*=sometimes'"):
        _twin_idle("kumiki", settings, dataclasses.replace(endpoints, placement_idle_reclaim="*=sometimes"))
