from __future__ import annotations

import csv
import json
import math
import random
from pathlib import Path

import pytest

from kumiki.cli.main import main

HEADER = "job_id,submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model\n"


def write_trace(path: Path, jobs: int = 240, *, seed: int = 4) -> Path:
    """Two queues with different typical run times, a job every 5 minutes over most of a day."""
    rng = random.Random(seed)
    lines = [HEADER]
    for index in range(jobs):
        queue, median = ("vc-fast", 120.0) if index % 3 else ("vc-slow", 4_000.0)
        duration = round(median * math.exp(rng.gauss(0.0, 0.4)))
        lines.append(f"job-{index},{index * 300},{1 + index % 2},,,{duration},,{queue},,\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err


def test_evaluate_writes_the_report_and_predictions_contract(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_trace(tmp_path / "trace.csv")
    out = tmp_path / "out"
    code, _ = run(["forecast", "evaluate", "--trace", str(trace), "--out", str(out), "--start-s", "36000"], capsys)
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    window_jobs = sum(1 for index in range(240) if index * 300 >= 36_000)
    assert set(report["models"]) == {
        "kumiki",
        "kumiki-ensemble",
        "history-median",
        "quantreg",
        "global-median",
        "last-two",
    }
    for scores in report["models"].values():
        assert set(scores) == {"jobs", "median_abs_log_error", "mae_s", "p90_coverage", "rank_agreement"}
        assert scores["rank_agreement"] is None or -1.0 <= scores["rank_agreement"] <= 1.0
        assert scores["jobs"] == window_jobs
        assert isinstance(scores["median_abs_log_error"], float) and scores["median_abs_log_error"] >= 0
        assert isinstance(scores["mae_s"], float) and scores["mae_s"] >= 0
        assert 0.0 <= scores["p90_coverage"] <= 1.0
    with (out / "predictions.csv").open(newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["job_id", "model", "p50_s", "p90_s"]
    assert len(rows) - 1 == window_jobs * 6
    pairs = {(row[0], row[1]) for row in rows[1:]}
    assert len(pairs) == window_jobs * 6  # one row per job and model
    assert all(float(row[3]) >= float(row[2]) > 0 for row in rows[1:])
    assert "| kumiki |" in (out / "report.md").read_text()
    # rolling origin: every day scored per model, and kumiki against that day's better baseline
    assert set(report["per_day"]) == {"day 0"}  # 240 jobs, 300 s apart: all on the first day
    assert set(report["per_day"]["day 0"]) == set(report["models"])
    (day,) = report["versus_better_baseline"]["kumiki"]["days"]
    assert day["test_day"] is False and day["better_baseline"] in ("global-median", "last-two")
    assert day["jobs"] == window_jobs
    markdown = (out / "report.md").read_text()
    assert set(report["per_queue"]) == {"vc-fast", "vc-slow"} and "Rolling origin" in markdown
    # per queue, busiest first: vc-fast has two jobs of every three
    per_queue = markdown.split("## Per queue")[1]
    assert per_queue.index("| vc-fast |") < per_queue.index("| vc-slow |")
    fast = report["per_queue"]["vc-fast"]["kumiki"]
    assert f"| vc-fast | {fast['jobs']} | {fast['median_abs_log_error']:.3f} |" in per_queue
    assert (out / "forecast_errors.png").read_bytes().startswith(b"\x89PNG")
    # The keys differ by 30x: Kumiki's per-key history must beat the global median.
    assert (
        report["models"]["kumiki"]["median_abs_log_error"] < report["models"]["global-median"]["median_abs_log_error"]
    )


def test_evaluate_subset_of_models_and_end_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", jobs=60)
    out = tmp_path / "out"
    argv = ["forecast", "evaluate", "--trace", str(trace), "--out", str(out), "--end-s", "6000"]
    code, _ = run([*argv, "--models", "kumiki,last-two"], capsys)
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["models"]) == ["kumiki", "last-two"]
    assert report["models"]["kumiki"]["jobs"] == 20  # submits 0, 300, ..., 5700


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--start-s", "100", "--end-s", "50"], "--end-s"),
        (["--models", "kumiki,oracle"], "--models"),
    ],
)
def test_evaluate_rejects_bad_options_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], option: str
) -> None:
    trace = write_trace(tmp_path / "trace.csv", jobs=10)
    code, err = run(["forecast", "evaluate", "--trace", str(trace), "--out", str(tmp_path / "o"), *extra], capsys)
    assert code == 2
    assert option in err


def test_evaluate_rejects_negative_or_non_numeric_seconds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("-5", "soon", "nan"):
        code, err = run(["forecast", "evaluate", "--trace", "t.csv", "--out", "o", "--start-s", value], capsys)
        assert code == 2
        assert "--start-s" in err


def test_evaluate_names_the_trace_when_it_is_missing_or_bad(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["forecast", "evaluate", "--trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path)], capsys)
    assert code == 2
    assert "--trace" in err and "nope.csv" in err
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER + "j1,0,one,,,10,,vc,,\n", encoding="utf-8")
    code, err = run(["forecast", "evaluate", "--trace", str(bad), "--out", str(tmp_path / "o")], capsys)
    assert code == 2
    assert "--trace" in err and "gpus" in err and ":2" in err


def test_evaluate_takes_a_bundled_trace_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    argv = ["forecast", "evaluate", "--trace", "philly-replay", "--out", str(out), "--models", "kumiki,last-two"]
    code, err = run([*argv, "--end-s", "3600"], capsys)
    assert code == 0, err
    report = json.loads((out / "report.json").read_text())
    assert report["models"]["kumiki"]["jobs"] > 0
    code, err = run(["forecast", "demand", "--trace", "no-such-bundle", "--out", str(tmp_path / "d")], capsys)
    assert code == 2 and "--trace" in err and "no-such-bundle" in err


def test_evaluate_refuses_an_out_path_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", jobs=10)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = run(["forecast", "evaluate", "--trace", str(trace), "--out", str(blocker)], capsys)
    assert code == 2
    assert "--out" in err


def test_demand_writes_backtest_forecast_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", jobs=900)  # 75 hours
    out = tmp_path / "demand"
    code, _ = run(["forecast", "demand", "--trace", str(trace), "--out", str(out), "--horizon-hours", "12"], capsys)
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["forecast"]) == {"vc-fast", "vc-slow"}
    assert len(report["forecast"]["vc-fast"]["arrivals_per_hour"]) == 12
    # Arrivals are exactly 8 an hour (flat: the mean); the GPU-hours vary, so Holt-Winters fits them.
    assert report["forecast"]["vc-fast"]["arrivals_model"] == "mean"
    assert report["forecast"]["vc-fast"]["arrivals_per_hour"] == [8.0] * 12
    assert report["forecast"]["vc-fast"]["gpu_hours_model"] == "holt-winters"
    assert set(report["backtest"]["vc-slow"]["gpu_hours"]) == {"holt-winters", "mean", "seasonal-naive"}
    assert (out / "demand.png").read_bytes().startswith(b"\x89PNG")
    assert "holt-winters" in (out / "report.md").read_text()


def test_demand_rejects_a_holdout_longer_than_the_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write_trace(tmp_path / "trace.csv", jobs=40)  # about 3 hours
    code, err = run(["forecast", "demand", "--trace", str(trace), "--out", str(tmp_path / "d")], capsys)
    assert code == 2
    assert "--holdout-hours" in err
    code, err = run(["forecast", "demand", "--trace", str(trace), "--out", "d", "--horizon-hours", "0"], capsys)
    assert code == 2
    assert "--horizon-hours" in err
