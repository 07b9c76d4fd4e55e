"""The report's figures that compare runs: the forecasts' cost per queue, over seeds, as a table, and whether a
change moved a figure beyond the runs' chaos (`paired_change`)."""

from __future__ import annotations

import pytest

from kumiki.sim.engine import JobResult, SimResult
from kumiki.sim.gate import GateLook
from kumiki.sim.report import (
    forecast_cost,
    forecast_cost_table,
    job_class,
    mean_interval,
    over_seeds,
    paired_change,
    recovered_shares,
    summarize,
)


def run(avg_jct_s: float, per_queue: dict[str, tuple[int, float]]) -> dict[str, object]:
    return {
        "jobs": sum(jobs for jobs, _ in per_queue.values()),
        "avg_jct_s": avg_jct_s,
        "per_queue": {queue: {"jobs": jobs, "avg_jct_s": jct} for queue, (jobs, jct) in per_queue.items()},
    }


def test_each_queues_part_is_its_gap_weighed_by_its_jobs_and_the_parts_add_up() -> None:
    runs = {
        # 30 jobs of "a" wait 100 s more with forecasts, 10 of "b" 200 s less: +75 and -50 of the average's +25
        "kumiki": run(1_025.0, {"a": (30, 1_100.0), "b": (10, 800.0)}),
        "kumiki-noforecast": run(1_000.0, {"a": (30, 1_000.0), "b": (10, 1_000.0)}),
    }
    cost = forecast_cost(runs)
    assert cost == {"a": pytest.approx(75.0), "b": pytest.approx(-50.0)}
    assert list(cost) == ["a", "b"]  # largest cost first
    assert sum(cost.values()) == pytest.approx(25.0)
    assert forecast_cost({"kumiki": runs["kumiki"]}) is None
    assert forecast_cost({name: {"jobs": 1, "avg_jct_s": 1.0} for name in runs}) is None


def test_over_seeds_averages_each_queues_part() -> None:
    by_seed = {
        0: {
            "kumiki": run(10.0, {"a": (2, 10.0), "b": (2, 10.0)}),
            "kumiki-noforecast": run(6.0, {"a": (2, 2.0), "b": (2, 10.0)}),
        },
        1: {
            "kumiki": run(10.0, {"a": (2, 10.0), "b": (2, 10.0)}),
            "kumiki-noforecast": run(12.0, {"a": (2, 10.0), "b": (2, 14.0)}),
        },
    }
    cost = over_seeds(by_seed)["forecast_cost_by_queue"]
    assert cost == {"a": pytest.approx(2.0), "b": pytest.approx(-1.0)}  # (+4, 0) and (0, -2)
    without = over_seeds({seed: {"kumiki": runs["kumiki"]} for seed, runs in by_seed.items()})
    assert without["forecast_cost_by_queue"] is None


def test_a_jobs_class_is_its_own_run_time_and_size() -> None:
    assert job_class(599.0, 1) == "< 10 min, 1 GPU"
    assert job_class(600.0, 4) == "10 min - 1 h, 2-7 GPUs"
    assert job_class(7_200.0, 8) == "1 - 6 h, >= 8 GPUs"
    assert job_class(21_600.0, 16) == ">= 6 h, >= 8 GPUs"
    assert job_class(100.0, 4, large_gpus=4) == "< 10 min, >= 4 GPUs"


def test_the_classes_parts_come_from_true_run_times_and_add_up_to_the_gap() -> None:
    def result(policy: str, finishes: list[float]) -> SimResult:
        # the same three jobs (two short single-GPU ones, one 2 h gang of 8) finishing at different times
        jobs = [
            JobResult("s1", 1, "a", 0.0, 0.0, finishes[0], 300.0, 0, 0.0, 0.0, 300.0),
            JobResult("s2", 1, "b", 0.0, 0.0, finishes[1], 300.0, 0, 0.0, 0.0, 300.0),
            JobResult("g", 8, "a", 0.0, 0.0, finishes[2], 7_200.0, 1, 0.0, 0.0, 7_200.0),
        ]
        return SimResult(policy, 16, jobs, [], 3)

    runs = {
        "kumiki": summarize(result("kumiki", [300.0, 600.0, 9_000.0])),
        "kumiki-noforecast": summarize(result("kumiki-noforecast", [900.0, 1_200.0, 7_200.0])),
    }
    assert runs["kumiki"]["per_class"] == {
        "< 10 min, 1 GPU": {"jobs": 2, "avg_jct_s": 450.0},
        "1 - 6 h, >= 8 GPUs": {"jobs": 1, "avg_jct_s": 9_000.0},
    }
    cost = forecast_cost(runs, by="class")
    # the short jobs gained 600 s each (-1,200 / 3 jobs), the gang lost 1,800 s (+600)
    assert cost == {"1 - 6 h, >= 8 GPUs": pytest.approx(600.0), "< 10 min, 1 GPU": pytest.approx(-400.0)}
    gap = runs["kumiki"]["avg_jct_s"] - runs["kumiki-noforecast"]["avg_jct_s"]
    assert sum(cost.values()) == pytest.approx(gap)
    both = over_seeds({0: runs, 1: runs})
    assert both["forecast_cost_by_class"] == cost
    assert both["forecast_cost_by_queue"] == forecast_cost(runs)
    assert forecast_cost_table(cost, {}, by="class").splitlines()[0] == "| class | whole run |"


def test_the_table_has_a_column_per_window_and_their_totals() -> None:
    windows = {
        "day 0": {"forecast_cost_by_queue": {"a": 1.5, "b": -0.5}},
        "day 1": {"forecast_cost_by_queue": None},  # nothing to compare there: no column
        "day 2": {"forecast_cost_by_queue": {"c": 4.0}},
    }
    table = forecast_cost_table({"b": 3.0, "a": -1.0}, windows)
    lines = table.splitlines()
    assert lines[0] == "| queue | whole run | day 0 | day 2 |"
    assert lines[2] == "| b | +3.0 | -0.5 |  |"
    assert lines[3] == "| a | -1.0 | +1.5 |  |"
    assert lines[4] == "| c |  |  | +4.0 |"
    assert lines[5] == "| **all (kumiki - kumiki-noforecast)** | **+2.0** | **+1.0** | **+4.0** |"
    assert forecast_cost_table(None, {}) == ""


def test_every_forecast_ordered_policy_present_gets_its_recovered_share() -> None:
    runs = {
        "kumiki-noforecast": run(1_000.0, {"a": (1, 1_000.0)}),
        "kumiki-oracle": run(800.0, {"a": (1, 800.0)}),
        "kumiki": run(950.0, {"a": (1, 950.0)}),
        "kumiki-gated": run(900.0, {"a": (1, 900.0)}),
    }
    assert recovered_shares(runs) == {"kumiki": pytest.approx(0.25), "kumiki-gated": pytest.approx(0.5)}
    assert over_seeds({0: runs})["recovered_share_by_policy"] == recovered_shares(runs)
    assert recovered_shares({"kumiki": runs["kumiki"]}) == {}


def test_a_gated_run_reports_the_share_of_looks_with_forecasts_on() -> None:
    looks = [GateLook(float(at), 10, {}, {}, on) for at, on in ((1, True), (2, False), (3, True), (4, True))]
    result = SimResult("kumiki-gated", 8, [JobResult("j", 1, "a", 0.0, 0.0, 10.0, 10.0, 0, 0.0, 0.0, 10.0)], [], 1)
    assert "gate_on_share" not in summarize(result)
    result.gate_looks = looks
    assert summarize(result)["gate_on_share"] == 0.75


def test_a_change_every_cell_shares_is_told_apart_and_its_interval_is_that_change() -> None:
    before = [0.10, -0.05, 0.30, 0.22, 0.01, 0.40, -0.12, 0.18, 0.26]
    change = paired_change(before, [share + 0.05 for share in before])
    assert change.mean == pytest.approx(0.05) and change.low == pytest.approx(0.05) == change.high
    # exact sign flips of nine cells: only the two patterns with every sign alike are as far from 0
    assert change.p_value == pytest.approx(2 / 2**9) and change.decided()
    assert (change.better, change.worse, change.cells) == (9, 0, 9)


def test_a_change_that_moves_cells_both_ways_is_within_the_chaos() -> None:
    before = [0.2] * 8
    after = [0.45, -0.1, 0.5, -0.05, 0.4, 0.0, 0.3, 0.1]  # +25, -30, +30, -25, +20, -20, +10, -10 points
    change = paired_change(before, after)
    assert change.mean == pytest.approx(0.0) and change.low < 0.0 < change.high
    assert change.p_value == 1.0 and not change.decided()
    assert (change.better, change.worse) == (4, 4)


def test_many_cells_are_tested_by_seeded_draws_and_the_answer_does_not_change() -> None:
    before = [0.01 * index for index in range(30)]
    after = [share + (0.04 if index % 3 else -0.01) for index, share in enumerate(before)]
    first, second = paired_change(before, after), paired_change(before, after)
    assert first == second
    assert first.mean == pytest.approx((20 * 0.04 - 10 * 0.01) / 30) and first.decided()
    assert first.low < first.mean < first.high


def test_cells_that_do_not_pair_are_refused() -> None:
    with pytest.raises(ValueError, match="3 before, 2 after"):
        paired_change([0.1, 0.2, 0.3], [0.1, 0.2])
    with pytest.raises(ValueError, match="no cells"):
        paired_change([], [])


def test_the_mean_of_cells_alike_is_certain_and_of_cells_apart_is_not() -> None:
    assert mean_interval([0.2] * 9) == pytest.approx((0.2, 0.2))
    shares = [0.035, 0.128, 0.102, 0.231, 0.041, 0.216, -0.012, 0.49, 0.263]  # nine weeks of one size
    low, high = mean_interval(shares)
    assert low < sum(shares) / len(shares) < high and min(shares) < low and high < max(shares)
    assert mean_interval(shares) == (low, high), "seeded: the same cells give the same interval"
    with pytest.raises(ValueError, match="no values"):
        mean_interval([])
