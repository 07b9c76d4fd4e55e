"""Where `kumiki` trails `kumiki-oracle`: the gap of average JCT split by kind of job, on other weeks.

One command: `PYTHONPATH=services .venv/bin/python benchmarks/gap_by_class.py [--weeks 9] [--weeks-seed 0]
[--nodes 48] [--seeds 0] [--workers 2] [--out DIR]`.

Issue 14 asks the forecasts to recover half of what exact run times gain over none. To know which jobs the rest of
that gain is in, every job of a run is put in a class: its run time and size, as `kumiki simulate` classes jobs
(`kumiki.sim.report.job_class`), and how its first forecast fared (p50 within 3x of the run time, "under" when the
job ran more than 3x longer, "over" when it ran under a third). For each class the benchmark prints what it adds
to the average JCT under `kumiki` and under `kumiki-oracle`, both against `kumiki-noforecast` run in the same
process on the same jobs (a class's JCT difference weighed by its share of all jobs, so the classes add up to the
runs' averages), and the class's share of the gap between the two. The weeks are the slice's days in other
orders (`kumiki.sim.shifts.day_orders`, as `benchmarks/sim_spread.py --weeks` draws them).

Classes are not independent: a long job served later lets others go first, so a class's figure says where the
time went, not what serving that class alone differently would gain. `--out` writes report.json and gap.png.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
from pathlib import Path
from typing import Any

from _support import PHILLY, RecordingForecaster, create_out_or_exit, run_in_processes, whole_numbers_or_exit

from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.report import runtime_class, size_class
from kumiki.sim.shifts import day_orders, reorder_days, trace_days
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8
KUMIKI, NOFORECAST, ORACLE = "kumiki", "kumiki-noforecast", "kumiki-oracle"
WITHIN = 3.0  # a first p50 within this factor of the run time counts as "within"

# per job: (GPUs, run time s, JCT s, first forecast p50 s or None)
JobRow = tuple[int, float, float, float | None]
Class = tuple[str, str, str]  # run time, size, how the first forecast fared


def run_one(order: tuple[int, ...], nodes: int, policy: str, seed: int) -> dict[str, JobRow]:
    jobs = sim_jobs(reorder_days(load_jobs(str(PHILLY)), order), max_gpus=nodes * GPUS_PER_NODE, seed=seed)
    forecaster = RecordingForecaster(build_default_forecaster()) if POLICIES[policy].uses_forecast else None
    result = Simulator(
        uniform_cluster(nodes, GPUS_PER_NODE), jobs, SimConfig(POLICIES[policy]), forecaster=forecaster
    ).run()
    first = forecaster.first_p50_s if forecaster else {}
    return {job.job_id: (job.gpus, job.duration_s, job.jct_s, first.get(job.job_id)) for job in result.jobs}


def job_class(gpus: int, runtime_s: float, p50_s: float | None) -> Class:
    """(run time, size, how the first forecast fared): `kumiki simulate`'s classes, split by forecast."""
    if p50_s is None:
        fared = "no forecast"
    else:
        ratio = runtime_s / max(p50_s, 1e-3)
        fared = "under" if ratio > WITHIN else "over" if ratio < 1.0 / WITHIN else "within 3x"
    return runtime_class(runtime_s), size_class(gpus, GPUS_PER_NODE), fared


def split(runs: dict[str, dict[str, JobRow]]) -> tuple[dict[Class, dict[str, float]], dict[str, float]]:
    """Per class: jobs, and what it adds to `kumiki`'s and the oracle's average JCT against no forecasts."""
    base = runs[NOFORECAST]
    count = len(base)
    classes: dict[Class, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for job_id, (gpus, runtime_s, jct_s, _) in base.items():
        row = classes[job_class(gpus, runtime_s, runs[KUMIKI][job_id][3])]
        row["jobs"] += 1
        row[KUMIKI] += (runs[KUMIKI][job_id][2] - jct_s) / count
        row[ORACLE] += (runs[ORACLE][job_id][2] - jct_s) / count
    means = {policy: statistics.fmean(row[2] for row in jobs.values()) for policy, jobs in runs.items()}
    return {name: dict(row) for name, row in classes.items()}, means


def label(name: Class) -> str:
    return ", ".join(name)


def plot(rows: list[tuple[Class, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = rows[:10][::-1]
    fig, ax = plt.subplots(figsize=(10, 5))
    places = range(len(shown))
    ax.barh([p + 0.2 for p in places], [row[KUMIKI] for _, row in shown], height=0.4, label=KUMIKI)
    ax.barh([p - 0.2 for p in places], [row[ORACLE] for _, row in shown], height=0.4, label=ORACLE)
    ax.set_yticks(list(places), [label(name) for name, _ in shown], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel(f"added to average JCT against {NOFORECAST} (s; negative: faster)")
    ax.set_title("Where kumiki trails the oracle: the ten classes with the largest gap")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weeks", default="9", help="other weeks built from the slice's days (9)")
    parser.add_argument("--weeks-seed", default="0", help="seed drawing the weeks' day orders (0)")
    parser.add_argument("--nodes", default="48", help="cluster size in 8-GPU nodes (48)")
    parser.add_argument("--seeds", default="0", help="workload seeds, comma-separated (0)")
    parser.add_argument("--workers", default="2", help="worker processes (2)")
    parser.add_argument("--out", default="", help="folder for report.json and gap.png (none: print only)")
    args = parser.parse_args()
    weeks = whole_numbers_or_exit(args.weeks, "--weeks", 1, parser)
    weeks_seed = whole_numbers_or_exit(args.weeks_seed, "--weeks-seed", 0, parser)
    nodes = whole_numbers_or_exit(args.nodes, "--nodes", 1, parser)
    seeds = whole_numbers_or_exit(args.seeds, "--seeds", 0, parser)
    workers = whole_numbers_or_exit(args.workers, "--workers", 1, parser)
    if len(weeks) != 1 or len(weeks_seed) != 1 or len(nodes) != 1 or len(workers) != 1:
        parser.error("--weeks, --weeks-seed, --nodes and --workers take one number each")
    out = Path(args.out) if args.out else None
    if out is not None:
        create_out_or_exit(out, parser)
    orders = day_orders(trace_days(load_jobs(str(PHILLY))), weeks[0], weeks_seed[0])

    plan = [
        (order, nodes[0], policy, seed) for order in orders for seed in seeds for policy in (KUMIKI, NOFORECAST, ORACLE)
    ]
    done: dict[tuple[Any, ...], dict[str, JobRow]] = {}
    for arguments, result in run_in_processes(run_one, plan, workers[0], lambda a: f"{a[2]} {a[0]} seed {a[3]}"):
        done[arguments] = result

    runs_count = len(orders) * len(seeds)
    total: dict[Class, dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    gaps, shares = [], []
    errors: dict[str, list[float]] = collections.defaultdict(list)  # size -> |log(run time / first p50)|
    for order in orders:
        for seed in seeds:
            runs = {policy: done[(order, nodes[0], policy, seed)] for policy in (KUMIKI, NOFORECAST, ORACLE)}
            classes, means = split(runs)
            for gpus, runtime_s, _, p50_s in runs[KUMIKI].values():
                if p50_s is not None:
                    errors[size_class(gpus, GPUS_PER_NODE)].append(abs(math.log(max(runtime_s, 1.0) / max(p50_s, 1.0))))
            for name, row in classes.items():
                for field, value in row.items():
                    total[name][field] += value / runs_count
            gaps.append(means[KUMIKI] - means[ORACLE])
            oracle_gain = means[NOFORECAST] - means[ORACLE]
            shares.append((means[NOFORECAST] - means[KUMIKI]) / oracle_gain if oracle_gain > 0 else float("nan"))
    gap = statistics.fmean(gaps)
    rows = sorted(total.items(), key=lambda item: -(item[1][KUMIKI] - item[1][ORACLE]))
    print(
        f"{len(orders)} weeks x {len(seeds)} seed(s) at {nodes[0]} x {GPUS_PER_NODE}: {KUMIKI} trails {ORACLE} by "
        f"{gap:,.0f} s of average JCT (mean); recovered share {statistics.fmean(shares):.1%} (mean)"
    )
    print(
        f"\n| class | jobs per week | {KUMIKI} vs no forecasts (s) | {ORACLE} vs no forecasts (s) | share of the gap |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, row in rows:
        if abs(row[KUMIKI] - row[ORACLE]) >= 0.005 * gap:
            print(
                f"| {label(name)} | {row['jobs']:,.0f} | {row[KUMIKI]:+.1f} | {row[ORACLE]:+.1f} | "
                f"{(row[KUMIKI] - row[ORACLE]) / gap:.0%} |"
            )
    by_size: dict[str, float] = collections.defaultdict(float)
    for name, row in rows:
        by_size[name[1]] += (row[KUMIKI] - row[ORACLE]) / gap
    print("\nshare of the gap by size: " + ", ".join(f"{size} {share:.0%}" for size, share in by_size.items()))
    median_error = {size: statistics.median(values) for size, values in sorted(errors.items())}
    print(
        "median |log error| of the first forecast by size: "
        + ", ".join(f"{size} {error:.2f} ({math.exp(error):.1f}x)" for size, error in median_error.items())
    )
    if out is not None:
        report = {
            "config": {
                "weeks": weeks[0],
                "weeks_seed": weeks_seed[0],
                "nodes": nodes[0],
                "seeds": seeds,
                "day_orders": [list(order) for order in orders],
            },
            "gap_s": gap,
            "recovered_shares": shares,
            "classes": {label(name): row for name, row in rows},
            "share_by_size": dict(by_size),
            "median_log_error_by_size": median_error,
        }
        (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        plot(rows, out / "gap.png")
        print(f"wrote {out / 'report.json'} and {out / 'gap.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
