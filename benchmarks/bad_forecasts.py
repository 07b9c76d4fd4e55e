"""What badly wrong forecasts cost the scheduler: forecasts that say nothing, that say the opposite, or that know
only the job's key (issue 14: "bad forecasts cost nothing").

    PYTHONPATH=services .venv/bin/python benchmarks/bad_forecasts.py [--nodes 48,64] [--seeds 0,1,2] [--workers 2]
        [--trace philly-slice] [--out out/bad-forecasts]

Forecasts (every one but the first READS THE TRUE RUN TIMES or ignores the job on purpose; each is passed
through `WeightedSelection` as its only expert, so its error record (`error_sigma`), its conformal p90 and its
trust are measured on these p50s as they would be on any model's):

- `kumiki`: the default forecaster, for reference;
- `noise`: 1,800 s x exp(N(0, 2.5)), one draw per job, whatever the job (the seventh step's);
- `reversed`: the k-th shortest job of the trace is forecast the k-th longest run time: the worst order;
- `key-shuffled`: the run time of a random job of the same (queue, GPUs) submitted within +-12 h: each key's
  distribution right, nothing about the job.

Policies, each over the seeds (ordering of same-second submits): `kumiki` (shipped), `kumiki` with the ninth
step's uncapped margin (`cap_margin_past_forecast=False`: a victim's margin is its key's error margin however
long it has run past its forecast), and `kumiki-trust` (each forecast weighed by its measured trust). Every
mean is compared with `kumiki-noforecast`'s (no forecaster) under the same seeds: a ratio above 1 is what the
forecasts cost. Writes report.json and bad-forecasts.png into --out and prints one markdown table per size.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from _support import run_in_processes, same_key_windows, simulation_grid, write_sizes_report

from kumiki.forecast.models import SelectionConfig, WeightedSelection, build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, RuntimeForecaster
from kumiki.sched.policies import POLICIES, QueuePolicy
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8
NOISE_MEDIAN_S, NOISE_SIGMA = 1800.0, 2.5
REGIME_WINDOW_S = 12 * 3600.0
TABLE_SEED = 0  # the draws of `noise` and `key-shuffled`, the same under every ordering seed
NOFORECAST = "kumiki-noforecast"
POLICY_ROWS: dict[str, QueuePolicy] = {
    "kumiki": POLICIES["kumiki"],
    "kumiki, uncapped margin": dataclasses.replace(POLICIES["kumiki"], cap_margin_past_forecast=False),
    "kumiki-trust": POLICIES["kumiki-trust"],
}
FORECASTS = ("kumiki", "noise", "reversed", "key-shuffled")


# ---- forecasts ------------------------------------------------------------------------------------
class TableForecaster:
    """Answers a fixed p50 per job with a tight claimed spread; what it is worth is measured around it."""

    def __init__(self, table: Mapping[str, float], name: str) -> None:
        self.table = table
        self.name = name

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        p50 = self.table[job.job_id]
        return RuntimeForecast(p50, p50 * 1.5, self.name, 0, log_sigma=0.3)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        pass


def noise_table(jobs: Sequence[SimJobSpec], rng: random.Random) -> dict[str, float]:
    return {job.job_id: NOISE_MEDIAN_S * math.exp(rng.gauss(0.0, NOISE_SIGMA)) for job in jobs}


def reversed_table(jobs: Sequence[SimJobSpec], rng: random.Random) -> dict[str, float]:
    by_length = sorted(jobs, key=lambda job: (job.duration_s, job.job_id))
    return {job.job_id: other.duration_s for job, other in zip(by_length, reversed(by_length), strict=True)}


def key_shuffled_table(jobs: Sequence[SimJobSpec], rng: random.Random) -> dict[str, float]:
    table: dict[str, float] = {}
    for members, windows in same_key_windows(jobs, REGIME_WINDOW_S):  # `jobs` come sorted by id: ties by id
        for job, (low, high) in zip(members, windows, strict=True):
            table[job.job_id] = members[rng.randrange(low, high)].duration_s
    return table


TABLES: dict[str, Callable[[Sequence[SimJobSpec], random.Random], dict[str, float]]] = {
    "noise": noise_table,
    "reversed": reversed_table,
    "key-shuffled": key_shuffled_table,
}


def forecaster_for(kind: str, jobs: Sequence[SimJobSpec]) -> RuntimeForecaster:
    if kind == "kumiki":
        return build_default_forecaster()
    table = TABLES[kind](sorted(jobs, key=lambda job: job.job_id), random.Random(TABLE_SEED))
    return WeightedSelection(SelectionConfig(experts=(kind,)), factories={kind: lambda: TableForecaster(table, kind)})


# ---- one run (in a worker process) ----------------------------------------------------------------
def run_one(trace_path: str, nodes: int, policy_row: str, kind: str, seed: int) -> float:
    jobs = sim_jobs(load_jobs(trace_path), max_gpus=nodes * GPUS_PER_NODE, seed=seed)
    if policy_row == NOFORECAST:
        policy, forecaster = POLICIES[NOFORECAST], None
    else:
        policy, forecaster = POLICY_ROWS[policy_row], forecaster_for(kind, jobs)
    result = Simulator(uniform_cluster(nodes, GPUS_PER_NODE), jobs, SimConfig(policy), forecaster=forecaster).run()
    return statistics.fmean(job.jct_s for job in result.jobs)


# ---- figures --------------------------------------------------------------------------------------
def size_summary(runs: Mapping[tuple[str, str], Mapping[int, float]]) -> dict[str, Any]:
    """Per forecast and policy: JCT per seed, mean, the mean's ratio to `kumiki-noforecast`'s and the worst seed's."""
    blind = runs[(NOFORECAST, "")]
    blind_mean = statistics.fmean(blind.values())
    cells: dict[str, dict[str, Any]] = {}
    for kind in FORECASTS:
        cells[kind] = {}
        for row in POLICY_ROWS:
            per_seed = runs[(row, kind)]
            mean = statistics.fmean(per_seed.values())
            cells[kind][row] = {
                "avg_jct_s": {str(seed): round(value, 1) for seed, value in sorted(per_seed.items())},
                "mean_s": round(mean, 1),
                "vs_noforecast": round(mean / blind_mean, 4),
                "worst_seed_vs_noforecast": round(max(value / blind[seed] for seed, value in per_seed.items()), 4),
            }
    return {
        "noforecast": {
            "avg_jct_s": {str(seed): round(value, 1) for seed, value in sorted(blind.items())},
            "mean_s": round(blind_mean, 1),
        },
        "forecasts": cells,
    }


def markdown(nodes: int, summary: Mapping[str, Any]) -> str:
    blind = summary["noforecast"]
    lines = [
        f"{nodes} x {GPUS_PER_NODE} GPUs: mean avg JCT s over the seeds, x `kumiki-noforecast` "
        f"({blind['mean_s']:,.0f} s), worst seed's ratio in brackets",
        "",
        "| forecasts | " + " | ".join(f"`{row}`" for row in POLICY_ROWS) + " |",
        "|---|" + "---:|" * len(POLICY_ROWS),
    ]
    for kind, rows in summary["forecasts"].items():
        cells = [
            f"{value['mean_s']:,.0f} ({value['vs_noforecast']:.3f}x; {value['worst_seed_vs_noforecast']:.3f}x)"
            for value in rows.values()
        ]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: Mapping[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    figure, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.5), squeeze=False)
    width = 0.8 / len(POLICY_ROWS)
    for axis, (nodes, summary) in zip(axes[0], sizes.items(), strict=True):
        every: list[float] = []
        for index, row in enumerate(POLICY_ROWS):
            ratios = [summary["forecasts"][kind][row]["vs_noforecast"] for kind in FORECASTS]
            every += ratios
            axis.bar([k + (index - 1) * width for k in range(len(FORECASTS))], ratios, width, label=row)
        axis.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        axis.set_xticks(range(len(FORECASTS)), FORECASTS)
        axis.set_ylabel("mean avg JCT / kumiki-noforecast")
        axis.set_ylim(min(every) - 0.02, max(every) + 0.03)  # bars from an offset: the differences are percent
        axis.set_title(f"{nodes} x {GPUS_PER_NODE} GPUs")
        axis.legend(fontsize=8, loc="upper left")
    figure.suptitle("What bad forecasts cost (Philly slice; above 1: worse than no forecasts)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    args, sizes, seeds, workers, out, _ = simulation_grid(parser, default_out="out/bad-forecasts")
    plan = [(str(args.trace), nodes, NOFORECAST, "", seed) for nodes in sizes for seed in seeds]
    plan += [
        (str(args.trace), nodes, row, kind, seed)
        for nodes in sizes
        for kind in FORECASTS
        for row in POLICY_ROWS
        for seed in seeds
    ]
    runs: dict[int, dict[tuple[str, str], dict[int, float]]] = {nodes: defaultdict(dict) for nodes in sizes}
    started = time.perf_counter()
    for (_, nodes, row, kind, seed), mean_jct in run_in_processes(
        run_one, plan, workers, lambda arguments: f"{arguments[2]} / {arguments[3] or '-'}, {arguments[1]} nodes"
    ):
        runs[nodes][(row, kind)][seed] = mean_jct
    report: dict[str, Any] = {
        "config": {"trace": str(args.trace), "seeds": seeds, "gpus_per_node": GPUS_PER_NODE, "table_seed": TABLE_SEED},
        "sizes": {str(nodes): size_summary(runs[nodes]) for nodes in sizes},
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_sizes_report(out, report, plot, "bad-forecasts.png", markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
