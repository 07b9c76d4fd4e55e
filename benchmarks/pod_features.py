"""What the features pods carry (image, command, time limit) are worth to the forecaster and to the schedule.

    .venv/bin/python benchmarks/pod_features.py [--jobs 1500] [--gpus 16] [--load 1.2] [--seeds 0,1,2]
        [--workers 2] [--out out/pod-features]

Issue 14 asks the live forecaster to use what pods carry (docs/forecast.md, "Features pods carry"). The public
traces carry none of it, so this runs `kumiki.sim.workload.featured_trace`: teams whose users run a few scripts
again and again under fresh job names, some asking for a time limit. For each seed, the same jobs with the
features and without them (`without_pod_features`):

- forecasting (`kumiki.forecast.evaluate.replay`, every job forecast at submit from the jobs finished before
  it): the default forecaster's median |log error| and p90 coverage;
- scheduling (`kumiki simulate`'s `Simulator` on `--gpus / 8` nodes of 8 GPUs): average JCT of `kumiki` with
  and without the features, `kumiki-noforecast`, `kumiki-oracle`, and the recovered share of each `kumiki` row
  ((noforecast - row) / (noforecast - oracle)).

Writes report.json, pod-features.png and each seed's trace (featured-seed<N>.csv, the trace schema with the
`image`, `command` and `time_limit_s` columns) into --out, and prints a markdown table with the spread over
seeds. The traces run through the CLI as they are: `kumiki forecast evaluate --trace out/pod-features/
featured-seed0.csv`, or `kumiki simulate --trace ... --nodes 2 --gpus-per-node 8`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _support import create_out_or_exit, run_in_processes, whole_numbers_or_exit

from kumiki.forecast.evaluate import replay
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.report import forecast_value
from kumiki.sim.trace import write_jobs
from kumiki.sim.workload import featured_trace, sim_jobs, without_pod_features

GPUS_PER_NODE = 8
ROWS = ("kumiki, with pod features", "kumiki, without", "kumiki-noforecast", "kumiki-oracle")


def run_one(jobs: int, gpus: int, load: float, seed: int, row: str) -> dict[str, Any]:
    trace = featured_trace(jobs, total_gpus=gpus, load=load, seed=seed)
    if row == "kumiki, without":
        trace = without_pod_features(trace)
    if row.startswith("forecast"):
        plain = row == "forecast, without"
        score = replay(without_pod_features(trace) if plain else trace, {"kumiki": build_default_forecaster}).scores
        return {
            "median_abs_log_error": score["kumiki"].median_abs_log_error,
            "p90_coverage": score["kumiki"].p90_coverage,
        }
    policy = POLICIES["kumiki" if row.startswith("kumiki,") else row]
    forecaster = build_default_forecaster() if policy.uses_forecast else None
    started = time.process_time()
    result = Simulator(
        uniform_cluster(gpus // GPUS_PER_NODE, GPUS_PER_NODE),
        sim_jobs(trace, max_gpus=gpus, seed=seed),
        SimConfig(policy),
        forecaster=forecaster,
    ).run()
    return {
        "avg_jct_s": statistics.fmean(job.jct_s for job in result.jobs),
        "preemptions": sum(job.preemptions for job in result.jobs),
        "cpu_s": time.process_time() - started,
    }


def share(noforecast: float, oracle: float, value: float) -> float | None:
    """The recovered share as `kumiki simulate` reports it (`kumiki.sim.report.forecast_value`)."""
    value_of = forecast_value(
        {
            "kumiki": {"avg_jct_s": value},
            "kumiki-noforecast": {"avg_jct_s": noforecast},
            "kumiki-oracle": {"avg_jct_s": oracle},
        }
    )
    return None if value_of is None else value_of["recovered_share"]


def markdown(report: dict[str, Any]) -> str:
    seeds = report["config"]["seeds"]
    lines = [
        "| seed | error with / without features | p90 coverage with | `kumiki` with | without | `kumiki-noforecast` "
        "| `kumiki-oracle` | share with | share without |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed in seeds:
        row = report["seeds"][str(seed)]
        with_share, without_share = row["share_with"], row["share_without"]
        lines.append(
            f"| {seed} | {row['error_with']:.3f} / {row['error_without']:.3f} | {row['coverage_with']:.3f} "
            f"| {row['jct'][ROWS[0]]:,.0f} | {row['jct'][ROWS[1]]:,.0f} | {row['jct'][ROWS[2]]:,.0f} "
            f"| {row['jct'][ROWS[3]]:,.0f} | {with_share:.0%} | {without_share:.0%} |"
        )
    summary = report["summary"]
    lines.append(
        f"| mean | {summary['error_with']:.3f} / {summary['error_without']:.3f} | | {summary['jct_with']:,.0f} "
        f"| {summary['jct_without']:,.0f} | | | {summary['share_with']:.0%} | {summary['share_without']:.0%} |"
    )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = report["config"]["seeds"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.2
    for index, name in enumerate(ROWS):
        values = [report["seeds"][str(seed)]["jct"][name] for seed in seeds]
        left.bar([seed + (index - 1.5) * width for seed in range(len(seeds))], values, width, label=name)
    left.set_xticks(range(len(seeds)), [f"seed {seed}" for seed in seeds])
    left.set_ylabel("average JCT (s)")
    left.legend(fontsize=7)
    left.set_title("scheduling")
    errors_with = [report["seeds"][str(seed)]["error_with"] for seed in seeds]
    errors_without = [report["seeds"][str(seed)]["error_without"] for seed in seeds]
    right.bar([seed - 0.15 for seed in range(len(seeds))], errors_with, 0.3, label="with pod features")
    right.bar([seed + 0.15 for seed in range(len(seeds))], errors_without, 0.3, label="without")
    right.set_xticks(range(len(seeds)), [f"seed {seed}" for seed in seeds])
    right.set_ylabel("median |log error|")
    right.legend(fontsize=7)
    right.set_title("forecasting")
    figure.suptitle("Features pods carry, on a synthetic cluster of scripts run again and again")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", default="1500", help="jobs per seed")
    parser.add_argument("--gpus", default="16", help="GPUs in the cluster, a multiple of 8")
    parser.add_argument("--load", default="1.2", help="offered load (GPU-seconds asked / offered)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of the synthetic trace, comma-separated")
    parser.add_argument("--workers", default="2", help="processes sharing the runs")
    parser.add_argument("--out", default="out/pod-features", help="folder for report.json and the plot")
    args = parser.parse_args()
    jobs = whole_numbers_or_exit(args.jobs, "--jobs", 1, parser)[0]
    gpus = whole_numbers_or_exit(args.gpus, "--gpus", GPUS_PER_NODE, parser)[0]
    if gpus % GPUS_PER_NODE:
        parser.error(f"--gpus: must be a multiple of {GPUS_PER_NODE}, got {gpus}")
    try:
        load = float(args.load)
    except ValueError:
        parser.error(f"--load: not a number: {args.load!r}")
    if not 0 < load < 10:
        parser.error(f"--load: must be in (0, 10), got {args.load}")
    seeds = whole_numbers_or_exit(args.seeds, "--seeds", 0, parser)
    workers = whole_numbers_or_exit(args.workers, "--workers", 1, parser)[0]
    out = Path(args.out)
    create_out_or_exit(out, parser)

    plan = [(jobs, gpus, load, seed, row) for seed in seeds for row in (*ROWS, "forecast, with", "forecast, without")]
    results: dict[tuple[int, str], dict[str, Any]] = {}
    started = time.perf_counter()
    for (_, _, _, seed, row), result in run_in_processes(run_one, plan, workers, lambda a: f"{a[4]}, seed {a[3]}"):
        results[(seed, row)] = result
    per_seed: dict[str, Any] = {}
    for seed in seeds:
        jct = {row: results[(seed, row)]["avg_jct_s"] for row in ROWS}
        per_seed[str(seed)] = {
            "jct": jct,
            "preemptions": {row: results[(seed, row)]["preemptions"] for row in ROWS},
            "error_with": results[(seed, "forecast, with")]["median_abs_log_error"],
            "error_without": results[(seed, "forecast, without")]["median_abs_log_error"],
            "coverage_with": results[(seed, "forecast, with")]["p90_coverage"],
            "share_with": share(jct[ROWS[2]], jct[ROWS[3]], jct[ROWS[0]]),
            "share_without": share(jct[ROWS[2]], jct[ROWS[3]], jct[ROWS[1]]),
        }

    def mean_of(field: str, row: str | None = None) -> float:
        values = [per_seed[str(seed)][field] if row is None else per_seed[str(seed)][field][row] for seed in seeds]
        return statistics.fmean(value for value in values if value is not None)

    means = {row: mean_of("jct", row) for row in ROWS}
    report: dict[str, Any] = {
        "config": {"jobs": jobs, "gpus": gpus, "load": load, "seeds": seeds},
        "seeds": per_seed,
        "summary": {
            "error_with": mean_of("error_with"),
            "error_without": mean_of("error_without"),
            "jct_with": means[ROWS[0]],
            "jct_without": means[ROWS[1]],
            "share_with": share(means[ROWS[2]], means[ROWS[3]], means[ROWS[0]]),
            "share_without": share(means[ROWS[2]], means[ROWS[3]], means[ROWS[1]]),
            "ratio_with_to_without": means[ROWS[0]] / means[ROWS[1]],
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    for seed in seeds:
        write_jobs(out / f"featured-seed{seed}.csv", featured_trace(jobs, total_gpus=gpus, load=load, seed=seed))
    plot(report, out / "pod-features.png")
    print(markdown(report))
    print(
        f"\nmean over seeds: `kumiki` with pod features / without = {report['summary']['ratio_with_to_without']:.3f}x;"
        f" wrote {out / 'report.json'} and {out / 'pod-features.png'} in {report['wall_s']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
