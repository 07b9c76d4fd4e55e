"""What the live forecast service learned wrong when it took a preempted attempt for a job's end.

    PYTHONPATH=services .venv/bin/python benchmarks/live_attempts.py [--nodes 48,64] [--seeds 0,1,2]
        [--workers 2] [--trace philly-slice] [--out out/live-attempts]

Until 7785472 the forecast service treated `PREEMPTED` on `kumiki.job.lifecycle` as an ending: it learned the
attempt's run time as the job's, and forecast the next generation afresh. The simulator never did (it learns a
job's duration once, at its end), so the simulator's numbers never showed what that cost. This runs `kumiki` on the
slice (its scheduling unchanged: the default forecaster) and beside it feeds two forecast books
(`kumiki.forecast.core.ForecastBook`, the service's own core) the events the live service would hear from that run
- submitted at arrival, bound at each (re)start, preempted at each eviction with the attempt's run time, ended
with the last attempt's:

- `attempts as endings` (the baseline, before): each eviction is learned as an ending with the attempt's run time,
  and the next generation is forecast again;
- `whole job` (now): an eviction is a stop; the ending learns the work of every attempt (here their wall run
  times: the simulator does not tell a forecaster the work lost, so this slightly overstates a preempted job).

Per book it scores the forecast placement would hold for each job when it ends against the job's true duration
(median |log error|, over all jobs and over the preempted ones, and the preempted ones' median log(actual / p50):
> 0 means forecast too short), and, for the preempted jobs, each run time the book learned against the job's true
duration. Prints a table per size
with the ratio now / before, and writes report.json and live-attempts.png into --out.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _support import run_in_processes, simulation_grid, write_sizes_report

from kumiki.forecast.core import ForecastBook
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, RuntimeForecaster, tell_started, tell_stopped
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8
BEFORE, NOW = "attempts as endings", "whole job"


@dataclass
class ShadowBooks:
    """The simulator's forecaster, with the live service's book fed the same run's lifecycle both ways beside it."""

    scheduling: RuntimeForecaster = field(default_factory=build_default_forecaster)
    books: dict[str, ForecastBook] = field(
        default_factory=lambda: {name: ForecastBook(build_default_forecaster()) for name in (BEFORE, NOW)}
    )
    features: dict[str, JobFeatures] = field(default_factory=dict)
    start_s: dict[str, float] = field(default_factory=dict)
    held: dict[str, dict[str, RuntimeForecast]] = field(default_factory=lambda: {BEFORE: {}, NOW: {}})
    preempted: set[str] = field(default_factory=set)
    learned: dict[str, list[tuple[str, float]]] = field(default_factory=lambda: {BEFORE: [], NOW: []})
    scored: dict[str, list[tuple[str, float, float]]] = field(default_factory=lambda: {BEFORE: [], NOW: []})

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        self.features[job.job_id] = job
        for name, book in self.books.items():
            given = book.submitted(job)
            if given is not None:
                self.held[name][job.job_id] = given
        return self.scheduling.predict(job)

    def started(self, job_id: str, start_s: float) -> None:
        tell_started(self.scheduling, job_id, start_s)
        self.start_s[job_id] = start_s
        for book in self.books.values():
            book.bound(self.features[job_id], start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        tell_stopped(self.scheduling, job_id, stop_s)
        ran_s = stop_s - self.start_s.get(job_id, stop_s)
        self.preempted.add(job_id)
        self.books[NOW].preempted(job_id, ran_s, 0.0, stop_s)
        before = self.books[BEFORE]
        learned = before.finished(job_id, ran_s, stop_s, self.features[job_id])
        if learned is not None:  # an attempt, learned as a job's run time
            self.learned[BEFORE].append((job_id, learned.runtime_s))
        again = before.submitted(self.features[job_id])  # the next generation, forecast afresh
        if again is not None:
            self.held[BEFORE][job_id] = again

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.scheduling.observe(job, runtime_s, finished_s)
        last_attempt_s = finished_s - self.start_s.get(job.job_id, finished_s - runtime_s)
        for name, book in self.books.items():
            forecast = self.held[name].pop(job.job_id)
            self.scored[name].append((job.job_id, runtime_s, forecast.p50_s))
            learned = book.finished(job.job_id, last_attempt_s, finished_s, job)
            if learned is not None:
                self.learned[name].append((job.job_id, learned.runtime_s))


def median_abs_log(pairs: list[tuple[float, float]]) -> float:
    return statistics.median(abs(math.log(actual / predicted)) for actual, predicted in pairs) if pairs else math.nan


def run_one(trace: str, nodes: int, seed: int) -> dict[str, Any]:
    jobs = sim_jobs(load_jobs(trace), max_gpus=nodes * GPUS_PER_NODE, seed=seed)
    shadow = ShadowBooks()
    result = Simulator(uniform_cluster(nodes, GPUS_PER_NODE), jobs, SimConfig(POLICIES["kumiki"]), forecaster=shadow)
    result.run()
    out: dict[str, Any] = {"jobs": len(jobs), "preempted_jobs": len(shadow.preempted)}
    duration = {job: actual for job, actual, _ in shadow.scored[NOW]}
    for name in (BEFORE, NOW):
        scored = shadow.scored[name]
        preempted = [(actual, p50) for job, actual, p50 in scored if job in shadow.preempted]
        learned = shadow.learned[name]
        out[name] = {
            "median_abs_log_error": median_abs_log([(actual, p50) for _, actual, p50 in scored]),
            "preempted_median_abs_log_error": median_abs_log(preempted),
            "preempted_median_log_bias": statistics.median(math.log(a / p) for a, p in preempted) if preempted else 0,
            "learned": len(learned),
            "preempted_learned_median_abs_log_error": median_abs_log(
                [(duration[job], runtime) for job, runtime in learned if job in shadow.preempted]
            ),
        }
    return out


def summarise(runs: dict[int, dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    keys = list(runs[seeds[0]][NOW])
    summary: dict[str, Any] = {
        "jobs": runs[seeds[0]]["jobs"],
        "preempted_jobs": statistics.fmean(runs[seed]["preempted_jobs"] for seed in seeds),
    }
    for name in (BEFORE, NOW):
        summary[name] = {key: statistics.fmean(runs[seed][name][key] for seed in seeds) for key in keys}
    ratios = {
        key: [runs[seed][NOW][key] / runs[seed][BEFORE][key] for seed in seeds if runs[seed][BEFORE][key]]
        for key in keys
    }
    summary["ratio_range"] = {key: [min(values), max(values)] if values else None for key, values in ratios.items()}
    summary["by_seed"] = {str(seed): runs[seed] for seed in seeds}
    return summary


def markdown(nodes: int, summary: dict[str, Any]) -> str:
    before, now = summary[BEFORE], summary[NOW]
    rows = [
        ("median abs log error, every job", "median_abs_log_error"),
        ("median abs log error, preempted jobs", "preempted_median_abs_log_error"),
        ("median log(actual / p50), preempted jobs", "preempted_median_log_bias"),
        ("run times learned", "learned"),
        ("preempted jobs: median abs log(duration / run time learned)", "preempted_learned_median_abs_log_error"),
    ]
    lines = [
        f"### {nodes} x {GPUS_PER_NODE} GPUs ({summary['jobs']} jobs, {summary['preempted_jobs']:.0f} preempted;"
        " mean over seeds)",
        "",
        f"| | {BEFORE} (before) | {NOW} (now) | now / before | per seed |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, key in rows:
        ratio = now[key] / before[key] if before[key] else math.nan
        low_high = summary["ratio_range"][key]
        spread = "n/a" if low_high is None else f"{low_high[0]:.3f} to {low_high[1]:.3f}"
        lines.append(f"| {label} | {before[key]:,.3f} | {now[key]:,.3f} | {ratio:.3f} | {spread} |")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    labels = ["forecast held,\nevery job", "forecast held,\npreempted jobs", "run times learned,\npreempted jobs"]
    keys = ["median_abs_log_error", "preempted_median_abs_log_error", "preempted_learned_median_abs_log_error"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.0 * len(sizes), 4.0), squeeze=False)
    for ax, (nodes, summary) in zip(axes[0], sizes.items(), strict=True):
        for offset, name in ((-0.2, BEFORE), (0.2, NOW)):
            values = [summary[name][key] for key in keys]
            ax.bar([index + offset for index in range(len(keys))], values, 0.4, label=name)
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("median |log(duration / p50 or learned)|")
        ax.set_title(f"{nodes} x {GPUS_PER_NODE} GPUs (mean over seeds)", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args, sizes, seeds, workers, out, _ = simulation_grid(parser, default_out="out/live-attempts")
    plan = [(str(args.trace), nodes, seed) for nodes in sizes for seed in seeds]
    started = time.perf_counter()
    runs: dict[int, dict[int, dict[str, Any]]] = {nodes: {} for nodes in sizes}
    for (_, nodes, seed), result in run_in_processes(
        run_one, plan, workers, lambda arguments: f"{arguments[1]} nodes seed {arguments[2]}"
    ):
        runs[nodes][seed] = result
    report: dict[str, Any] = {
        "config": {"trace": str(args.trace), "seeds": seeds, "gpus_per_node": GPUS_PER_NODE, "policy": "kumiki"},
        "sizes": {str(nodes): summarise(runs[nodes], seeds) for nodes in sizes},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_sizes_report(out, report, plot, "live-attempts.png", markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
