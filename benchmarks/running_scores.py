"""Scoring the forecaster's models on the jobs still running: does it order jobs better, and does that pay?

    .venv/bin/python benchmarks/running_scores.py [--nodes 48,64] [--seeds 0,1,2] [--workers 2]
        [--trace philly-slice] [--out out/running-scores]

Issue 14's fourteenth step (docs/design/0003-forecast-trust.md). `WeightedSelection` weighs its models by
their recent |log error| per key level. Scored on finished jobs only, that record favours the models that say
"short" while long runs are going: only the short jobs have finished. The default now scores each key
level's last ~100 started jobs, a running one by the error it already proves (`StartCohorts`), and weighs
the Kaplan-Meier expert (`history-censored`) with the others.

Rows, each over the seeds, under the `kumiki` policy: the default; the record before (finished jobs only,
decayed) without and with `history-censored`; the new record without it; and the references
`kumiki-noforecast` and `kumiki-oracle` for the recovered share ((noforecast - row) / (noforecast - oracle),
of the seed means). For the forecasters, on the forecasts they issued in the run (the first seed): the
median |log error| against the true run time, and Kendall's tau between forecast and run time (how well the
forecasts order the jobs, which is what the policy uses them for).

Writes report.json and running-scores.png into --out and prints one markdown table per size.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any

from _support import RecordingForecaster, plot_rows_by_seed, run_in_processes, simulation_grid, write_sizes_report

from kumiki.forecast.models import DEFAULT_SELECTION, SelectionConfig, WeightedSelection
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8
WITHOUT_CENSORED = tuple(name for name in DEFAULT_SELECTION if name != "history-censored")

# row name -> forecaster config (None: a reference policy without a forecaster)
ROWS: dict[str, SelectionConfig | None] = {
    "kumiki-noforecast": None,
    "kumiki-oracle": None,
    "default (started-job record, censored expert)": SelectionConfig(),
    "finished-only record (before)": SelectionConfig(score_running=False, experts=WITHOUT_CENSORED),
    "finished-only record, censored expert": SelectionConfig(score_running=False),
    "started-job record, no censored expert": SelectionConfig(experts=WITHOUT_CENSORED),
}
BEFORE = "finished-only record (before)"


def run_one(trace_path: str, nodes: int, row: str, seed: int) -> dict[str, Any]:
    config = ROWS[row]
    jobs = sim_jobs(load_jobs(trace_path), max_gpus=nodes * GPUS_PER_NODE, seed=seed)
    recording = RecordingForecaster(WeightedSelection(config)) if config is not None else None
    policy = POLICIES["kumiki"] if config is not None else POLICIES[row]
    result = Simulator(uniform_cluster(nodes, GPUS_PER_NODE), jobs, SimConfig(policy), forecaster=recording).run()
    out: dict[str, Any] = {"avg_jct_s": statistics.fmean(job.jct_s for job in result.jobs)}
    if recording is not None:
        from scipy.stats import kendalltau

        forecast = [math.log(recording.last_p50_s[job.job_id]) for job in result.jobs]
        actual = [math.log(max(job.duration_s, 1.0)) for job in result.jobs]
        out["median_abs_log_error"] = statistics.median(abs(f - a) for f, a in zip(forecast, actual, strict=True))
        out["kendall_tau"] = float(kendalltau(forecast, actual).statistic)
    return out


def size_summary(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    means = {row: statistics.fmean(run["avg_jct_s"] for run in runs[row].values()) for row in ROWS}
    none, oracle, before = means["kumiki-noforecast"], means["kumiki-oracle"], means[BEFORE]
    rows: dict[str, Any] = {}
    for row in ROWS:
        first = runs[row][min(runs[row])]
        rows[row] = {
            "avg_jct_s": {str(seed): round(run["avg_jct_s"], 1) for seed, run in sorted(runs[row].items())},
            "mean_s": round(means[row], 1),
            "vs_before": round(means[row] / before, 4),
            "recovered": round((none - means[row]) / (none - oracle), 4) if none != oracle else None,
            "median_abs_log_error": round(first["median_abs_log_error"], 3) if ROWS[row] is not None else None,
            "kendall_tau": round(first["kendall_tau"], 3) if ROWS[row] is not None else None,
        }
    return {"rows": rows}


def markdown(nodes: int, summary: dict[str, Any]) -> str:
    lines = [
        f"{nodes} x {GPUS_PER_NODE} GPUs: avg JCT s per seed, mean, against the record before, recovered share;"
        " the forecasts issued (first seed): median |log error|, Kendall's tau against the run time",
        "",
        "| row | per seed | mean | x before | recovered | median abs log error | tau |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row, values in summary["rows"].items():
        seeds = " / ".join(f"{value:,.0f}" for value in values["avg_jct_s"].values())
        recovered = f"{values['recovered']:.1%}" if values["recovered"] is not None else "-"
        error = f"{values['median_abs_log_error']:.3f}" if values["median_abs_log_error"] is not None else "-"
        tau = f"{values['kendall_tau']:.3f}" if values["kendall_tau"] is not None else "-"
        lines.append(
            f"| {row} | {seeds} | {values['mean_s']:,.0f} | {values['vs_before']:.3f} | {recovered} | {error} | {tau} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Any) -> None:
    plot_rows_by_seed(
        report, path, "Scoring the models on running jobs too (Philly slice)", GPUS_PER_NODE, highlight="default"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args, sizes, seeds, workers, out, _ = simulation_grid(parser, default_out="out/running-scores")

    plan = [(str(args.trace), nodes, row, seed) for nodes in sizes for seed in seeds for row in ROWS]
    results: dict[int, dict[str, dict[int, dict[str, Any]]]] = {nodes: {row: {} for row in ROWS} for nodes in sizes}
    started = time.perf_counter()
    for (_, nodes, row, seed), result in run_in_processes(
        run_one, plan, workers, lambda arguments: f"{arguments[2]}, {arguments[1]} nodes, seed {arguments[3]}"
    ):
        results[nodes][row][seed] = result

    report: dict[str, Any] = {
        "config": {"trace": str(args.trace), "seeds": seeds, "gpus_per_node": GPUS_PER_NODE, "rows": list(ROWS)},
        "sizes": {str(nodes): size_summary(results[nodes]) for nodes in sizes},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_sizes_report(out, report, plot, "running-scores.png", markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
