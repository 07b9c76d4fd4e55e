"""What jobs that report their progress are worth to the order, and what reports that mislead cost.

    PYTHONPATH=services .venv/bin/python benchmarks/progress_reports.py [--nodes 48,64] [--seeds 0,1,2]
        [--workers 2] [--trace philly-slice] [--out out/progress-reports]

Issue 14's target (the forecasts recover half of `kumiki-oracle`'s gain over `kumiki-noforecast`) is out of reach
on what a Philly week carries: a whole-node job's queue and GPU count say little of whether it runs one hour or
four days, and those ~100 jobs a week hold most of the gap (docs/simulator.md, seventeenth and eighteenth steps).
A training job knows how far it has got. This runs `kumiki` on the slice under the scenario of
`kumiki simulate --progress-reports` (docs/design/0007-progress-reports.md), with the baseline (no job reports)
and both references in the same process, per cluster size and seed:

- `none`: no job reports (today's `kumiki`, the baseline every ratio is against);
- `>=8 GPUs`: the whole-node jobs report, each report off by a factor e^N(0, 0.2) fixed per job;
- `>=8 GPUs, noise 0.5`, `2.0`, `4.0`: their reports worse, then worthless (a factor e^N(0, 4) says less of a
  job's run time than its queue does: the order must not lose by them);
- `>=8 GPUs, half`: half of them report;
- `every job`: every job reports (noise 0.2).

`--sensitivity` adds the whole-node scenario under one-factor changes of the progress forecaster's constants
(`ProgressConfig`: the prior width of a report's belief, the prior's weight, the record's window), which were
set before anything was measured and not tuned.

Prints one markdown table per size (mean JCT over the seeds, its ratio to the baseline, the recovered share and
its per-seed range) and writes report.json and progress-reports.png into --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from _support import run_in_processes, simulation_grid, write_sizes_report

from kumiki.forecast.models import WeightedSelection, build_default_forecaster
from kumiki.forecast.models.progress import ProgressConfig, ProgressForecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import RuntimeForecaster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.scenarios import ProgressReports
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8
KUMIKI, NOFORECAST, ORACLE = "kumiki", "kumiki-noforecast", "kumiki-oracle"
TARGET_SHARE = 0.5
BASELINE = "none"
# scenario -> (min GPUs, share of them reporting, noise sigma); None: no job reports
SCENARIOS: dict[str, tuple[int, float, float] | None] = {
    BASELINE: None,
    ">=8 GPUs": (GPUS_PER_NODE, 1.0, 0.2),
    ">=8 GPUs, noise 0.5": (GPUS_PER_NODE, 1.0, 0.5),
    ">=8 GPUs, noise 2.0": (GPUS_PER_NODE, 1.0, 2.0),
    ">=8 GPUs, noise 4.0": (GPUS_PER_NODE, 1.0, 4.0),
    ">=8 GPUs, half": (GPUS_PER_NODE, 0.5, 0.2),
    "every job": (1, 1.0, 0.2),
}


# --sensitivity: the whole-node scenario with one of the progress forecaster's constants changed
SENSITIVITY: dict[str, dict[str, Any]] = {
    ">=8 GPUs, prior sigma 0.75": {"prior_sigma": 0.75},
    ">=8 GPUs, prior sigma 3": {"prior_sigma": 3.0},
    ">=8 GPUs, prior weight 1": {"prior_weight": 1.0},
    ">=8 GPUs, prior weight 25": {"prior_weight": 25.0},
    ">=8 GPUs, window 50": {"window": 50},
    ">=8 GPUs, window 1000": {"window": 1000},
}
WHOLE_NODES = ">=8 GPUs"


def forecaster_for(scenario: str) -> RuntimeForecaster:
    """The default forecaster; under a sensitivity scenario, its progress layer with one constant changed."""
    if scenario not in SENSITIVITY:
        return build_default_forecaster()
    return ProgressForecaster(WeightedSelection(), ProgressConfig(**SENSITIVITY[scenario]))


def run_one(trace: str, nodes: int, policy: str, scenario: str, seed: int) -> float:
    """One simulation's average JCT; a fresh forecaster per run."""
    jobs = sim_jobs(load_jobs(trace), max_gpus=nodes * GPUS_PER_NODE, seed=seed)
    setting = SCENARIOS[WHOLE_NODES if scenario in SENSITIVITY else scenario]
    reports = None if setting is None else ProgressReports(*setting, seed=seed)
    result = Simulator(
        uniform_cluster(nodes, GPUS_PER_NODE),
        jobs,
        SimConfig(POLICIES[policy], progress_reports=reports),
        forecaster=forecaster_for(scenario) if POLICIES[policy].uses_forecast else None,
    ).run()
    return statistics.fmean(job.jct_s for job in result.jobs)


def share(noforecast: float, oracle: float, kumiki: float) -> float | None:
    return None if noforecast == oracle else (noforecast - kumiki) / (noforecast - oracle)


def size_summary(
    runs: dict[tuple[str, str], dict[int, float]], seeds: list[int], scenarios: list[str]
) -> dict[str, Any]:
    """Per scenario: mean JCT over the seeds, its ratio to no reports, the recovered share and its per-seed range."""
    mean = {key: statistics.fmean(by_seed[seed] for seed in seeds) for key, by_seed in runs.items()}
    noforecast, oracle = mean[(NOFORECAST, BASELINE)], mean[(ORACLE, BASELINE)]
    baseline = mean[(KUMIKI, BASELINE)]
    rows: dict[str, Any] = {}
    for scenario in scenarios:
        per_seed = [
            share(runs[(NOFORECAST, BASELINE)][seed], runs[(ORACLE, BASELINE)][seed], runs[(KUMIKI, scenario)][seed])
            for seed in seeds
        ]
        known = [value for value in per_seed if value is not None]
        rows[scenario] = {
            "avg_jct_s": mean[(KUMIKI, scenario)],
            "over_no_reports": mean[(KUMIKI, scenario)] / baseline,
            "over_noforecast": mean[(KUMIKI, scenario)] / noforecast,
            "recovered_share": share(noforecast, oracle, mean[(KUMIKI, scenario)]),
            "recovered_share_by_seed": per_seed,
            "recovered_share_range": [min(known), max(known)] if known else None,
        }
    return {"noforecast_avg_jct_s": noforecast, "oracle_avg_jct_s": oracle, "scenarios": rows}


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def markdown(nodes: int, summary: dict[str, Any]) -> str:
    lines = [
        f"### {nodes} x {GPUS_PER_NODE} GPUs (`kumiki-noforecast` {summary['noforecast_avg_jct_s']:,.0f} s,"
        f" `kumiki-oracle` {summary['oracle_avg_jct_s']:,.0f} s)",
        "",
        "| who reports | kumiki avg JCT s | / no reports | / noforecast | recovered | per-seed range |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for scenario, row in summary["scenarios"].items():
        low_high = row["recovered_share_range"]
        spread = "n/a" if low_high is None else f"{percent(low_high[0])} to {percent(low_high[1])}"
        lines.append(
            f"| {scenario} | {row['avg_jct_s']:,.0f} | {row['over_no_reports']:.3f} | {row['over_noforecast']:.3f}"
            f" | {percent(row['recovered_share'])} | {spread} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    labels = list(next(iter(sizes.values()))["scenarios"])
    fig, ax = plt.subplots(figsize=(max(9.0, 1.3 * len(labels)), 4.6))
    width = 0.8 / max(1, len(sizes))
    for index, (nodes, summary) in enumerate(sizes.items()):
        xs = [position + index * width for position in range(len(labels))]
        values = [100 * (summary["scenarios"][name]["recovered_share"] or 0.0) for name in labels]
        ax.bar(xs, values, width, label=f"{nodes} x {GPUS_PER_NODE} (mean over seeds)")
        for x, name in zip(xs, labels, strict=True):
            points = [
                100 * value for value in summary["scenarios"][name]["recovered_share_by_seed"] if value is not None
            ]
            ax.scatter([x] * len(points), points, s=10, color="black", zorder=3)
    ax.axhline(100 * TARGET_SHARE, color="black", linestyle=":", linewidth=0.9, label="issue 14's target (50%)")
    ax.axhline(0.0, color="black", linewidth=0.9)
    ax.set_xticks([position + width * (len(sizes) - 1) / 2 for position in range(len(labels))])
    ax.set_xticklabels([label.replace(", ", "\n") for label in labels], fontsize=8)
    ax.set_ylabel("share of the oracle's gain recovered, %")
    ax.set_title("kumiki on the Philly slice when jobs report their progress (dots: single seeds)", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sensitivity", action="store_true", help="also the whole-node scenario under one-factor constant changes"
    )
    args, sizes, seeds, workers, out, _ = simulation_grid(parser, default_out="out/progress-reports")
    scenarios = [*SCENARIOS, *(SENSITIVITY if args.sensitivity else {})]
    plan = [
        (str(args.trace), nodes, KUMIKI, scenario, seed) for nodes in sizes for scenario in scenarios for seed in seeds
    ]
    plan += [
        (str(args.trace), nodes, policy, BASELINE, seed)
        for nodes in sizes
        for policy in (NOFORECAST, ORACLE)
        for seed in seeds
    ]
    started = time.perf_counter()
    runs: dict[int, dict[tuple[str, str], dict[int, float]]] = {nodes: {} for nodes in sizes}

    def describe(arguments: tuple[Any, ...]) -> str:
        _, nodes, policy, scenario, seed = arguments
        return f"{nodes} nodes {policy} {scenario} seed {seed}"

    for (_, nodes, policy, scenario, seed), jct in run_in_processes(run_one, plan, workers, describe):
        runs[nodes].setdefault((policy, scenario), {})[seed] = jct
    report: dict[str, Any] = {
        "config": {
            "trace": str(args.trace),
            "seeds": seeds,
            "gpus_per_node": GPUS_PER_NODE,
            "scenarios": SCENARIOS,
            "sensitivity": SENSITIVITY if args.sensitivity else None,
        },
        "sizes": {str(nodes): size_summary(runs[nodes], seeds, scenarios) for nodes in sizes},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_sizes_report(out, report, plot, "progress-reports.png", markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
