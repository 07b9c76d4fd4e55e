"""Trust measures through the scheduler: does mixing towards the forecast-free order, by either measure, pay?

    .venv/bin/python benchmarks/trust_measures.py [--nodes 48,64] [--seeds 0,1,2] [--workers 2]
        [--trace philly-slice] [--out out/trust-measures]

Issue 14's twelfth step (docs/design/0003-forecast-trust.md). `kumiki-trust` weighs each forecast against the
forecast-free prior by the forecast's `trust` (`kumiki.sched.policies.gittins_key`). Two measures of trust:

- `error` (`ForecastTrust`, shipped in `kumiki-trust`): 1 - (the key's median |log error| / the prior's)^2;
- `concordance` (`ConcordanceTrust`): the probability that the key's forecasts order its jobs against the
  cluster's recent ones better than a coin (Somers' D above 0), whatever their size of error.

Rows, each over the seeds (same-second submits ordered by the seed), the same forecaster apart from the trust
measure: `kumiki` (trust unused), `kumiki-trust` with each measure (trust updated by the job's survival), the
concordance measure with a fixed weight (`trust_update=False`), and the two references `kumiki-noforecast` and
`kumiki-oracle` for the recovered share ((noforecast - row) / (noforecast - oracle), of the seed means).
"Trust < 0.5" is the share of forecasts issued with trust below one half. Then, from the `kumiki` run's
forecasts, each queue's mean Somers' D over its last 100 finished jobs: how well the forecasts order.

Writes report.json and trust-measures.png into --out and prints one markdown table per size.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Any

from _support import plot_rows_by_seed, run_in_processes, simulation_grid, write_sizes_report

from kumiki.forecast.models import (
    ConcordanceTrust,
    SelectionConfig,
    TrustConfig,
    TrustMeasure,
    WeightedSelection,
    build_trust,
)
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures
from kumiki.sched.policies import POLICIES, QueuePolicy
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8

# row name -> (policy, trust measure of the forecaster; None: no forecaster)
ROWS: dict[str, tuple[QueuePolicy, str | None]] = {
    "kumiki-noforecast": (POLICIES["kumiki-noforecast"], None),
    "kumiki-oracle": (POLICIES["kumiki-oracle"], None),
    "kumiki (trust unused)": (POLICIES["kumiki"], "concordance"),
    "kumiki-trust, error": (POLICIES["kumiki-trust"], "error"),
    "kumiki-trust, concordance": (POLICIES["kumiki-trust"], "concordance"),
    "kumiki-trust, concordance, fixed weight": (
        dataclasses.replace(POLICIES["kumiki-trust"], trust_update=False),
        "concordance",
    ),
}


class _CountingTrust:
    """A trust measure that keeps every trust it gives (measurement only)."""

    def __init__(self, measure: TrustMeasure) -> None:
        self.measure = measure
        self.given: list[float] = []

    def trust(self, job: JobFeatures) -> float:
        value = self.measure.trust(job)
        self.given.append(value)
        return value

    def update(self, job: JobFeatures, log_runtime_s: float, log_p50_s: float) -> None:
        self.measure.update(job, log_runtime_s, log_p50_s)


def run_one(trace_path: str, nodes: int, row: str, seed: int) -> dict[str, Any]:
    policy, measure = ROWS[row]
    jobs = sim_jobs(load_jobs(trace_path), max_gpus=nodes * GPUS_PER_NODE, seed=seed)
    forecaster: WeightedSelection | None = None
    counting: _CountingTrust | None = None
    if measure is not None:
        config = TrustConfig(measure=measure)
        forecaster = WeightedSelection(SelectionConfig(trust=config))
        counting = forecaster.trust = _CountingTrust(build_trust(config))
    result = Simulator(uniform_cluster(nodes, GPUS_PER_NODE), jobs, SimConfig(policy), forecaster=forecaster).run()
    out: dict[str, Any] = {"avg_jct_s": statistics.fmean(job.jct_s for job in result.jobs)}
    if counting is not None and counting.given:
        out["trust_below_half"] = sum(value < 0.5 for value in counting.given) / len(counting.given)
    concordance = counting.measure if counting is not None else None
    if isinstance(concordance, ConcordanceTrust) and not policy.use_trust:
        queues = sorted({job.queue for job in result.jobs})
        out["queue_concordance"] = {
            queue: record for queue in queues if (record := concordance.record(("q", queue))) is not None
        }
        out["cluster_concordance"] = concordance.record(("all",))
    return out


def size_summary(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    means = {row: statistics.fmean(run["avg_jct_s"] for run in runs[row].values()) for row in ROWS}
    none, oracle, kumiki = means["kumiki-noforecast"], means["kumiki-oracle"], means["kumiki (trust unused)"]
    rows: dict[str, Any] = {}
    for row in ROWS:
        below = [run["trust_below_half"] for run in runs[row].values() if "trust_below_half" in run]
        rows[row] = {
            "avg_jct_s": {str(seed): round(run["avg_jct_s"], 1) for seed, run in sorted(runs[row].items())},
            "mean_s": round(means[row], 1),
            "vs_kumiki": round(means[row] / kumiki, 4),
            "recovered": round((none - means[row]) / (none - oracle), 4) if none != oracle else None,
            "trust_below_half": round(statistics.fmean(below), 3) if below else None,
        }
    first = min(runs["kumiki (trust unused)"])
    kumiki_run = runs["kumiki (trust unused)"][first]
    return {
        "rows": rows,
        "concordance_seed": first,
        "cluster_concordance": kumiki_run.get("cluster_concordance"),
        "queue_concordance": kumiki_run.get("queue_concordance", {}),
    }


def markdown(nodes: int, summary: dict[str, Any]) -> str:
    lines = [
        f"{nodes} x {GPUS_PER_NODE} GPUs: avg JCT s per seed, mean, against `kumiki`, recovered share",
        "",
        "| row | per seed | mean | x kumiki | recovered | trust < 0.5 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row, values in summary["rows"].items():
        seeds = " / ".join(f"{value:,.0f}" for value in values["avg_jct_s"].values())
        recovered = f"{values['recovered']:.1%}" if values["recovered"] is not None else "-"
        below = f"{values['trust_below_half']:.0%}" if values["trust_below_half"] is not None else "-"
        lines.append(
            f"| {row} | {seeds} | {values['mean_s']:,.0f} | {values['vs_kumiki']:.3f} | {recovered} | {below} |"
        )
    cluster = summary["cluster_concordance"]
    if cluster:
        lines += ["", f"Somers' D of `kumiki`'s forecasts (seed {summary['concordance_seed']}), last 100 per queue:"]
        lines.append(
            f"cluster {cluster[0]:.2f}; "
            + ", ".join(
                f"{queue} {mean:.2f} ({count})"
                for queue, (mean, count) in sorted(summary["queue_concordance"].items(), key=lambda item: -item[1][1])
            )
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Any) -> None:
    plot_rows_by_seed(report, path, "Trust measures through the scheduler (Philly slice)", GPUS_PER_NODE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args, sizes, seeds, workers, out, _ = simulation_grid(parser, default_out="out/trust-measures")

    plan = [(nodes, row, seed) for nodes in sizes for seed in seeds for row in ROWS]
    results: dict[int, dict[str, dict[int, dict[str, Any]]]] = {nodes: {row: {} for row in ROWS} for nodes in sizes}
    started = time.perf_counter()
    runs = [(str(args.trace), nodes, row, seed) for nodes, row, seed in plan]
    for (_, nodes, row, seed), result in run_in_processes(
        run_one, runs, workers, lambda arguments: f"{arguments[2]}, {arguments[1]} nodes, seed {arguments[3]}"
    ):
        results[nodes][row][seed] = result

    report: dict[str, Any] = {
        "config": {"trace": str(args.trace), "seeds": seeds, "gpus_per_node": GPUS_PER_NODE, "rows": list(ROWS)},
        "sizes": {str(nodes): size_summary(results[nodes]) for nodes in sizes},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_sizes_report(out, report, plot, "trust-measures.png", markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
