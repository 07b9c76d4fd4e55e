"""How good, and what kind of, forecasts `kumiki` needs to recover half of the oracle's gain (issue 14).

    .venv/bin/python benchmarks/forecast_value_bounds.py [--nodes 48,64] [--trace philly-slice] [--quick]
        [--order-seeds 0,1,2]
        [--out out/forecast-value-bounds]

Replays the trace under `kumiki` with synthetic forecasters and reports, per cluster size, each one's median
|log(p50 / true run time)| against the share of the oracle's gain over `kumiki-noforecast` it recovers
(`kumiki.sim.report.forecast_value`: (noforecast - forecast) / (noforecast - oracle) in average JCT).

Every synthetic forecaster except the default one READS THE TRUE RUN TIMES on purpose: they are information
bounds, not models. Rows:

- `kumiki-noforecast`, `kumiki-oracle`: the two references (their own policies, no forecaster);
- `kumiki (default forecaster)`: `build_default_forecaster()`, fresh per run;
- `noisy truth s=S`: p50 = true x exp(N(0, S)) (one draw per job, seeds 0, 1, 2), log_sigma = S, p90 from S:
  a forecaster that knows each job, with log-normal error of known size;
- `key-regime oracle`: p50 = median and log_sigma = population std of log run time of the jobs with the same
  (queue, gpus) submitted within +-12 h (the job included): a perfect per-key model that knows the current
  regime but nothing about the individual job;
- `burst oracle`: the same within +-600 s (jobs submitted together). A job alone in its window gets its own
  run time, so this row knows more than a burst model could; report.json gives the share of such jobs;
- `true run times of <size> jobs only`: the default forecaster, except that the jobs of one size class (1 GPU,
  2-7 GPUs, >= 8 GPUs) get their true run time: which jobs' forecasts the share is lost on.

`--order-seeds` repeats every run per seed ordering the jobs submitted in the same second; a row's share is
then that of its mean JCT over the seeds (the references' too), its range the spread of the per-seed shares.
`--quick` runs only the references, the default forecaster, `noisy truth s=0.6` seed 0, the two window
oracles and the three size classes. Writes report.json and recovered.png (x: median |log error|, y: recovered
share) into --out; prints one markdown table per size.
"""

from __future__ import annotations

import argparse
import functools
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _support import PHILLY, create_out_or_exit, out_and_trace_or_exit, same_key_windows, whole_numbers_or_exit
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import (
    UNINFORMED_P50_S,
    Z90,
    JobFeatures,
    RuntimeForecast,
    RuntimeForecaster,
    tell_started,
    tell_stopped,
)
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.report import forecast_value, size_class, summarize, write_json
from kumiki.sim.workload import WorkloadError, sim_jobs

GPUS_PER_NODE = 8
NOISE_SIGMAS = (0.3, 0.6, 1.0)
NOISE_SEEDS = (0, 1, 2)
REGIME_WINDOW_S = 12 * 3600.0
BURST_WINDOW_S = 600.0
# a window whose run times all agree still gets this spread (the policies floor sigma at 0.02 themselves)
MIN_LOG_SIGMA = 0.05
NOFORECAST, ORACLE, DEFAULT = "kumiki-noforecast", "kumiki-oracle", "kumiki"
TARGET_SHARE = 0.5
SIZE_CLASSES = tuple(size_class(gpus, GPUS_PER_NODE) for gpus in (1, 2, GPUS_PER_NODE))  # 1, 2-7, >= 8 GPUs

Maker = Callable[[Sequence[SimJobSpec]], RuntimeForecaster]


# ---- forecasters ----------------------------------------------------------------------------------
def lognormal_forecast(p50: float, sigma: float, model: str) -> RuntimeForecast:
    """A forecast of median p50 and log-normal spread sigma (its p90 read off both), as every bound here gives."""
    return RuntimeForecast(p50, p50 * math.exp(Z90 * sigma), model, 1, log_sigma=sigma)


class NoisyTruth:
    """Reads the true run time: p50 = true x exp(N(0, sigma)), one fixed draw per job; log_sigma = sigma."""

    def __init__(self, jobs: Sequence[SimJobSpec], sigma: float, seed: int) -> None:
        rng = random.Random(seed)
        # drawn in submit order up front, so a job's error does not depend on when the policy asks
        self.p50 = {job.job_id: job.duration_s * math.exp(rng.gauss(0.0, sigma)) for job in jobs}
        self.sigma = max(sigma, MIN_LOG_SIGMA)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return lognormal_forecast(self.p50[job.job_id], self.sigma, "noisy-truth")

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        pass


class WindowOracle:
    """Reads the true run times of a job's neighbours: median and population std of log run time of the jobs
    with the same (queue, gpus) submitted within +-`window_s` of it, the job itself included."""

    def __init__(self, jobs: Sequence[SimJobSpec], window_s: float, model: str) -> None:
        self.model = model
        self.belief: dict[str, tuple[float, float]] = {}
        self.window_sizes: list[int] = []
        for members, windows in same_key_windows(jobs, window_s):
            durations = np.array([job.duration_s for job in members])
            logs = np.log(np.maximum(durations, 1.0))
            for job, (low, high) in zip(members, windows, strict=True):
                sigma = float(np.std(logs[low:high]))
                self.belief[job.job_id] = (float(np.median(durations[low:high])), max(sigma, MIN_LOG_SIGMA))
                self.window_sizes.append(high - low)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        return lognormal_forecast(*self.belief[job.job_id], self.model)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        pass


class ClassTruth:
    """The default forecaster, except that the jobs of one size class (`kumiki.sim.report.size_class`) get their
    true run time: what forecasting that class perfectly would recover, with the rest forecast as now."""

    def __init__(self, jobs: Sequence[SimJobSpec], size: str) -> None:
        self.inner = build_default_forecaster()
        self.truth = {job.job_id: job.duration_s for job in jobs}
        self.size = size

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        forecast = self.inner.predict(job)  # asked for every job: it keeps a record of what it forecast
        if size_class(int(job.gpus), GPUS_PER_NODE) != self.size:
            return forecast
        return lognormal_forecast(self.truth[job.job_id], MIN_LOG_SIGMA, "class-truth")

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.inner.observe(job, runtime_s, finished_s)

    def started(self, job_id: str, start_s: float) -> None:
        tell_started(self.inner, job_id, start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        tell_stopped(self.inner, job_id, stop_s)


class Scored:
    """Passes a forecaster through and records |log(p50 / true run time)| of every forecast it gives."""

    def __init__(self, inner: RuntimeForecaster, truth: Mapping[str, float]) -> None:
        self.inner = inner
        self.truth = truth
        self.errors: dict[str, float] = {}

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        forecast = self.inner.predict(job)
        self.errors[job.job_id] = abs(math.log(max(forecast.p50_s, 1e-9) / self.truth[job.job_id]))
        return forecast

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.inner.observe(job, runtime_s, finished_s)

    def started(self, job_id: str, start_s: float) -> None:
        tell_started(self.inner, job_id, start_s)  # a pass-through: the default forecaster listens for starts

    def stopped(self, job_id: str, stop_s: float) -> None:
        tell_stopped(self.inner, job_id, stop_s)  # and for stops


# ---- the rows -------------------------------------------------------------------------------------
@dataclass
class Row:
    """One table row: a policy and, for `kumiki`, one forecaster per seed (several seeds: mean and range)."""

    label: str
    kind: str  # "reference", "model" or "reads truth"
    policy: str
    # seed -> the forecaster of that run, built from the jobs (None: the policy runs without one)
    make: dict[int, Maker | None] = field(default_factory=lambda: {0: None})


def noisy_truth(sigma: float, seed: int) -> Maker:
    return lambda jobs: NoisyTruth(jobs, sigma, seed)


def window_oracle(window_s: float, name: str) -> Maker:
    return lambda jobs: WindowOracle(jobs, window_s, name)


def class_truth(size: str) -> Maker:
    return lambda jobs: ClassTruth(jobs, size)


def default_forecaster(jobs: Sequence[SimJobSpec]) -> RuntimeForecaster:
    return build_default_forecaster()  # fresh per run: it learns online, and one run must not learn from another


def rows(quick: bool) -> list[Row]:
    out = [Row(NOFORECAST, "reference", NOFORECAST), Row(ORACLE, "reference", ORACLE)]
    out.append(Row("kumiki (default forecaster)", "model", DEFAULT, {0: default_forecaster}))
    for sigma in (0.6,) if quick else NOISE_SIGMAS:
        seeds = (0,) if quick else NOISE_SEEDS
        makers: dict[int, Maker | None] = {seed: noisy_truth(sigma, seed) for seed in seeds}
        out.append(Row(f"noisy truth s={sigma:.1f}", "reads truth", DEFAULT, makers))
    for window_s, name in ((REGIME_WINDOW_S, "key-regime oracle (+-12 h)"), (BURST_WINDOW_S, "burst oracle (+-600 s)")):
        out.append(Row(name, "reads truth", DEFAULT, {0: window_oracle(window_s, name)}))
    for size in SIZE_CLASSES:
        out.append(Row(f"true run times of {size} jobs only", "reads truth", DEFAULT, {0: class_truth(size)}))
    return out


def run_count(table: Sequence[Row]) -> int:
    return sum(len(row.make) for row in table)


def simulate(
    nodes: int, jobs: Sequence[SimJobSpec], table: Sequence[Row], progress: Progress, overall: Any
) -> dict[str, Any]:
    """Every run of every row on `nodes` x 8 GPUs; the rows of report.json for this size."""
    spec = uniform_cluster(nodes, GPUS_PER_NODE)
    truth = {job.job_id: job.duration_s for job in jobs}
    prior_error = float(np.median([abs(math.log(UNINFORMED_P50_S / d)) for d in truth.values()]))
    out: dict[str, Any] = {}
    for row in table:
        runs: list[dict[str, Any]] = []
        for seed, make in row.make.items():
            suffix = f" seed {seed}" if len(row.make) > 1 else ""
            progress.update(overall, description=f"{nodes} nodes: {row.label}{suffix}")
            jobs_task = progress.add_task("  jobs", total=len(jobs))
            inner = make(jobs) if make is not None else None
            scored = Scored(inner, truth) if inner is not None else None
            started = time.perf_counter()
            result = Simulator(
                spec,
                jobs,
                SimConfig(POLICIES[row.policy]),
                forecaster=scored,
                progress=functools.partial(progress.advance, jobs_task),
            ).run()
            run: dict[str, Any] = {
                "seed": seed,
                "avg_jct_s": summarize(result, large_gpus=GPUS_PER_NODE)["avg_jct_s"],
                "wall_s": round(time.perf_counter() - started, 1),
            }
            if scored is not None:
                run["median_abs_log_error"] = float(np.median(list(scored.errors.values())))
                run["forecasts"] = len(scored.errors)
            if isinstance(inner, WindowOracle):
                run["median_window_jobs"] = float(np.median(inner.window_sizes))
                run["share_alone_in_window"] = float(np.mean([size == 1 for size in inner.window_sizes]))
            runs.append(run)
            progress.remove_task(jobs_task)
            progress.advance(overall)
        out[row.label] = {"kind": row.kind, "policy": row.policy, "runs": runs}
    # the recovered share of each run against the two references of the same size
    references = {name: out[name]["runs"][0] for name in (NOFORECAST, ORACLE)}
    for label, entry in out.items():
        for run in entry["runs"]:
            value = forecast_value({**references, label: run}, forecast=label)
            run["recovered_share"] = None if value is None else value["recovered_share"]
        entry.update(aggregate(entry["runs"]))
    out[NOFORECAST]["median_abs_log_error"] = prior_error  # the uninformed prior's median, 1,800 s
    out[NOFORECAST]["note"] = "median_abs_log_error is the uninformed prior's (p50 1,800 s) error"
    out[ORACLE]["median_abs_log_error"] = 0.0
    return out


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and min-max over seeds of each measure that every run has."""
    out: dict[str, Any] = {}
    for key in ("avg_jct_s", "recovered_share", "median_abs_log_error"):
        values = [run[key] for run in runs if run.get(key) is not None]
        if len(values) == len(runs):
            out[key] = statistics.fmean(values)
            if len(values) > 1:
                out[f"{key}_range"] = [min(values), max(values)]
    return out


# ---- output ---------------------------------------------------------------------------------------
def markdown(nodes: int, table: Mapping[str, Any]) -> str:
    lines = [
        f"### {nodes} x {GPUS_PER_NODE} GPUs",
        "",
        "| forecaster | median abs log error | avg JCT s | recovered share |",
        "|---|---:|---:|---:|",
    ]
    for label, row in table.items():
        error = row.get("median_abs_log_error")
        error_cell = "" if error is None else f"{error:.3f}"
        if label == NOFORECAST:
            error_cell += " (1,800 s prior)"
        share = row.get("recovered_share")
        share_cell = "n/a (no gap)" if share is None else f"{100 * share:.1f}%"
        if "recovered_share_range" in row:
            low, high = row["recovered_share_range"]
            share_cell += f" ({100 * low:.1f}-{100 * high:.1f}%)"
        seeds = f", {len(row['runs'])} runs" if len(row["runs"]) > 1 else ""
        name = f"{label} [reads truth{seeds}]" if row["kind"] == "reads truth" else label
        lines.append(f"| {name} | {error_cell} | {row['avg_jct_s']:,.0f} | {share_cell} |")
    return "\n".join(lines) + "\n"


def plot(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = ("o", "s", "^", "D", "v", "P")
    fig, ax = plt.subplots(figsize=(8, 5))
    widest = 0.0
    for index, (nodes, table) in enumerate(report["clusters"].items()):
        xs, ys, lows, highs, labels = [], [], [], [], []
        for label, row in table.items():
            if row.get("recovered_share") is None or row.get("median_abs_log_error") is None:
                continue
            share = 100 * row["recovered_share"]
            low, high = (100 * v for v in row.get("recovered_share_range", (row["recovered_share"],) * 2))
            xs.append(row["median_abs_log_error"])
            ys.append(share)
            lows.append(share - low)
            highs.append(high - share)
            if label == NOFORECAST:
                label += " (x: 1,800 s prior)"
            labels.append(f"{label} [reads truth]" if row["kind"] == "reads truth" else label)
        ax.errorbar(
            xs,
            ys,
            yerr=[lows, highs],
            fmt=markers[index % len(markers)],
            capsize=3,
            label=f"{nodes} x {GPUS_PER_NODE} GPUs",
            alpha=0.85,
        )
        if index == 0:
            placed: list[tuple[float, float]] = []
            for x, y, label in zip(xs, ys, labels, strict=True):
                crowded = any(abs(x - px) < 0.05 and abs(y - py) < 5 for px, py in placed)
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -11 if crowded else 4), fontsize=7)
                placed.append((x, y))
        widest = max(widest, *xs)
    ax.set_xlim(-0.03, widest * 1.45)  # room for the labels right of the points
    ax.axhline(100 * TARGET_SHARE, color="black", linestyle="--", linewidth=0.9, label="50% of the oracle's gain")
    ax.set_xlabel("median |log(p50 / true run time)| of the forecasts")
    ax.set_ylabel("oracle's gain over kumiki-noforecast recovered (%)")
    ax.set_title(
        "policy kumiki with synthetic forecasts: accuracy against value (labels on the first size)\n"
        "[reads truth]: information bounds that read true run times, not models",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def over_order_seeds(per_seed: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """One table from the same rows run under several ordering seeds. A row's avg JCT is the mean of all its runs,
    its recovered share that of the mean JCTs (one seed's share is a ratio of two small differences of chaotic
    runs: `kumiki-noforecast` alone moves by 7.6% between seeds 0 and 1 at 48 x 8), and its range the spread of
    the per-seed shares. With one seed, that seed's table as it is."""
    seeds = list(per_seed)
    if len(seeds) == 1:
        return dict(per_seed[seeds[0]])
    first = per_seed[seeds[0]]
    out: dict[str, Any] = {}
    for label in first:
        runs = [{**run, "order_seed": seed} for seed in seeds for run in per_seed[seed][label]["runs"]]
        entry: dict[str, Any] = {"kind": first[label]["kind"], "policy": first[label]["policy"], "runs": runs}
        entry.update(aggregate(runs))
        for key in ("median_abs_log_error", "note"):
            if key in first[label]:
                entry.setdefault(key, first[label][key])
        shares = [per_seed[seed][label].get("recovered_share") for seed in seeds]
        entry.pop("recovered_share_range", None)
        if all(share is not None for share in shares):
            entry["recovered_share_range"] = [min(shares), max(shares)]
        entry["recovered_share_by_order_seed"] = shares
        out[label] = entry
    references = {name: {"avg_jct_s": out[name]["avg_jct_s"]} for name in (NOFORECAST, ORACLE)}
    for label, entry in out.items():
        value = forecast_value({**references, label: entry}, forecast=label)
        entry["recovered_share"] = None if value is None else value["recovered_share"]
    return out


# ---- command line ---------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="48,64", help="cluster sizes in 8-GPU nodes, comma-separated (48,64)")
    parser.add_argument("--trace", default=str(PHILLY), help="job trace: a CSV path or a bundled name (kumiki.data)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="references, the default, noisy s=0.6 seed 0, the two oracles, the three size classes",
    )
    parser.add_argument(
        "--order-seeds",
        default="0",
        help="seeds that order jobs submitted in the same second (kumiki simulate --seeds), comma-separated: every"
        " run is repeated per seed and each row's share is that of its mean JCT over them (default 0)",
    )
    parser.add_argument("--out", default="out/forecast-value-bounds", help="folder for report.json and recovered.png")
    args = parser.parse_args()
    sizes = whole_numbers_or_exit(args.nodes, "--nodes", 1, parser)
    order_seeds = whole_numbers_or_exit(args.order_seeds, "--order-seeds", 0, parser)
    out, trace = out_and_trace_or_exit(args.out, args.trace, parser)
    workloads: dict[tuple[int, int], list[SimJobSpec]] = {}
    for nodes in sizes:
        for seed in order_seeds:
            try:
                workloads[(nodes, seed)] = sim_jobs(trace, max_gpus=nodes * GPUS_PER_NODE, seed=seed)
            except WorkloadError as error:
                parser.error(f"--nodes {nodes} / --trace: {error}")
    create_out_or_exit(out, parser)

    table = rows(args.quick)
    report: dict[str, Any] = {
        "config": {
            "trace": str(args.trace),
            "nodes": sizes,
            "gpus_per_node": GPUS_PER_NODE,
            "quick": args.quick,
            "order_seeds": order_seeds,
            "noise_sigmas": [0.6] if args.quick else list(NOISE_SIGMAS),
            "noise_seeds": [0] if args.quick else list(NOISE_SEEDS),
            "regime_window_s": REGIME_WINDOW_S,
            "burst_window_s": BURST_WINDOW_S,
            "recovered_share": "(noforecast - forecast) / (noforecast - oracle), average JCT",
        },
        "clusters": {},
    }
    started = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        overall = progress.add_task("runs", total=run_count(table) * len(sizes) * len(order_seeds))
        for nodes in sizes:
            per_seed = {
                seed: simulate(nodes, workloads[(nodes, seed)], table, progress, overall) for seed in order_seeds
            }
            report["clusters"][str(nodes)] = over_order_seeds(per_seed)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    write_json(out / "report.json", report)
    plot(report, out / "recovered.png")
    for nodes, rows_of_size in report["clusters"].items():
        print(markdown(int(nodes), rows_of_size))
    print(f"wall {report['wall_s']:,.0f} s; wrote {out / 'report.json'} and {out / 'recovered.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
