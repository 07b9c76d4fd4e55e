"""Does `kumiki` hold its margins on workloads the slice does not show? Spread over cluster loads and VC mixes.

    PYTHONPATH=services .venv/bin/python benchmarks/sim_spread.py [--nodes 36,40,44,48,56,64,72]
        [--seeds 0,1,2] [--drop-each-queue 48] [--shift-at 48,64] [--weeks 9 [--weeks-at 48]] [--workers 2]
        [--trace philly-slice] [--progress-reports MIN_GPUS] [--out out/sim-spread]

Issue 14 measured `kumiki` on Philly weeks this repository does not have. Three stand-ins for "another week" can
be cut from the slice without tuning anything to them:

- **load**: the same jobs on fewer or more nodes (`--nodes`): at 36 x 8 the queue is hours deep, at 72 x 8 it
  barely forms. Whether forecasts help depends on how deep the queue is, so a policy that wins only at the two
  sizes it was measured at is caught here;
- **mix**: the slice with one VC left out, for every VC in turn (`--drop-each-queue NODES`, a jackknife at that
  size): another week's VC mix, from the VCs this one has. Leaving out a VC the forecaster serves badly, or
  one that carries a third of the GPU time, changes both who waits and what the forecaster learns;
- **shift**: issue 14's synthetic distribution shifts (`kumiki.sim.shifts`, `kumiki simulate --shift`) at each
  size of `--shift-at`: the busiest VC's run times 10x from the slice's middle on (`x10`, which also overloads
  the cluster), and the second busiest VC renamed to one never seen (`new-vc`);
- **week** (`--weeks N`, off by default): N other weeks built from the slice's own days in random orders
  (`kumiki.sim.shifts.reorder_days`, `kumiki simulate --day-order`) at `--weeks-at` nodes. Every day keeps its
  jobs and times of day; what changes is what the forecaster has learnt when each day comes and what still runs
  from the days before, which is what an unseen week of the same cluster changes. The slice's own order is one
  draw of this, and the issue's weeks A and B are others.

Every cell runs `kumiki`, its two references (`kumiki-noforecast`, `kumiki-oracle`) and `tiresias` and
`srtf-oracle` under each ordering seed (`kumiki simulate --seeds`: the order of jobs submitted in the same second).
A cell's recovered share is that of its mean JCTs over the seeds (`kumiki.sim.report.forecast_value`), its range
the spread of the per-seed shares; "kumiki <= noforecast" counts seeds. Each part's verdict gives its mean share
with a 95% bootstrap interval over its cells (`kumiki.sim.report.mean_interval`); to ask whether a change moved
`kumiki`, run this before and after it and pair the two reports with `benchmarks/spread_diff.py`. Writes
report.json and spread.png into --out and prints one markdown table per part. Runs are independent simulations:
--workers processes share them (default: the machine's cores). `--progress-reports MIN_GPUS` runs every cell under
the scenario of `kumiki simulate --progress-reports` (jobs of at least MIN_GPUS GPUs report their progress, off by
e^N(0, 0.2); docs/design/0007-progress-reports.md): only `kumiki` hears the reports.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from _support import PHILLY, create_out_or_exit, out_and_trace_or_exit, run_in_processes, whole_numbers_or_exit

from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.report import mean_interval, over_seeds, summarize, write_json
from kumiki.sim.scenarios import ProgressReports
from kumiki.sim.shifts import (
    SHIFTS,
    ShiftError,
    day_orders,
    parse_day_order,
    reorder_days,
    shift_trace,
    trace_days,
)
from kumiki.sim.trace import TraceJob, load_jobs
from kumiki.sim.workload import WorkloadError, sim_jobs

GPUS_PER_NODE = 8
KUMIKI, NOFORECAST, ORACLE, TIRESIAS, SRTF = "kumiki", "kumiki-noforecast", "kumiki-oracle", "tiresias", "srtf-oracle"
POLICY_NAMES = (KUMIKI, NOFORECAST, ORACLE, TIRESIAS, SRTF)
SRTF_BOUND = 1.15  # issue 14: kumiki within 1.15x of srtf-oracle
TARGET_SHARE = 0.5

# a cell: (nodes, the queue left out or "" for none, the shift, "days:3,6,5,2,0,4,1" for a day order, or "" for
# none); a run: a cell, a policy and a seed
Cell = tuple[int, str, str]
DAYS_PREFIX = "days:"


# ---- one run (in a worker process) ----------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _trace(path: str, shift: str) -> tuple[TraceJob, ...]:
    jobs = load_jobs(path)
    if shift.startswith(DAYS_PREFIX):
        return tuple(reorder_days(jobs, parse_day_order(shift.removeprefix(DAYS_PREFIX))))
    return tuple(shift_trace(jobs, shift).jobs if shift else jobs)


def day_order_text(order: tuple[int, ...]) -> str:
    """A day order as `kumiki simulate --day-order` takes it (and `parse_day_order` reads it back)."""
    return ",".join(str(day) for day in order)


def run_one(trace: str, cell: Cell, policy: str, seed: int, reports: ProgressReports | None = None) -> dict[str, Any]:
    """One simulation; a fresh forecaster per run (it learns online, and one run must not learn from another)."""
    nodes, drop, shift = cell
    jobs = sim_jobs(
        [job for job in _trace(trace, shift) if job.queue != drop], max_gpus=nodes * GPUS_PER_NODE, seed=seed
    )
    started = time.perf_counter()
    result = Simulator(
        uniform_cluster(nodes, GPUS_PER_NODE),
        jobs,
        SimConfig(POLICIES[policy], progress_reports=None if reports is None else replace(reports, seed=seed)),
        forecaster=build_default_forecaster() if POLICIES[policy].uses_forecast else None,
    ).run()
    summary = summarize(result, large_gpus=GPUS_PER_NODE)
    return {"avg_jct_s": summary["avg_jct_s"], "jobs": len(jobs), "wall_s": round(time.perf_counter() - started, 1)}


# ---- a cell's figures -----------------------------------------------------------------------------
def cell_summary(runs: Mapping[str, Mapping[int, Mapping[str, Any]]]) -> dict[str, Any]:
    """Mean JCT per policy over the seeds, the ratios issue 14 sets bounds on, and the recovered share (of the
    mean JCTs; one seed's share is a ratio of two small differences of chaotic runs) with its per-seed range."""
    seeds = sorted(runs[KUMIKI])
    spread = over_seeds({seed: {name: runs[name][seed] for name in POLICY_NAMES} for seed in seeds})
    mean = {name: spread["policies"][name]["avg_jct_s"] for name in POLICY_NAMES}
    whole = spread["forecast_value"]
    per_seed_shares = spread["recovered_share_by_seed"]
    known = [share for share in per_seed_shares if share is not None]
    return {
        "jobs": runs[KUMIKI][seeds[0]]["jobs"],
        "avg_jct_s": mean,
        "kumiki_over_noforecast": mean[KUMIKI] / mean[NOFORECAST],
        "kumiki_over_tiresias": mean[KUMIKI] / mean[TIRESIAS],
        "kumiki_over_srtf_oracle": mean[KUMIKI] / mean[SRTF],
        "oracle_gain_share": 1.0 - mean[ORACLE] / mean[NOFORECAST],
        "recovered_share": None if whole is None else whole["recovered_share"],
        "recovered_share_by_seed": per_seed_shares,
        "recovered_share_range": [min(known), max(known)] if known else None,
        "seeds_kumiki_at_most_noforecast": sum(
            runs[KUMIKI][seed]["avg_jct_s"] <= runs[NOFORECAST][seed]["avg_jct_s"] for seed in seeds
        ),
        "seeds_kumiki_at_most_tiresias": sum(
            runs[KUMIKI][seed]["avg_jct_s"] <= runs[TIRESIAS][seed]["avg_jct_s"] for seed in seeds
        ),
        "seeds": seeds,
        "runs": {name: {str(seed): dict(runs[name][seed]) for seed in seeds} for name in POLICY_NAMES},
    }


def percent(value: float | None) -> str:
    return "n/a (no gap)" if value is None else f"{100 * value:.1f}%"


def markdown(title: str, first_column: str, cells: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        f"### {title}",
        "",
        f"| {first_column} | jobs | kumiki s | noforecast s | oracle s | tiresias s | srtf-oracle s"
        " | kumiki / noforecast | kumiki / tiresias | kumiki / srtf | oracle's gain | recovered (per-seed range)"
        " | seeds kumiki <= noforecast |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, cell in cells.items():
        jct = cell["avg_jct_s"]
        spread = cell["recovered_share_range"]
        share = percent(cell["recovered_share"])
        if spread is not None and len(cell["seeds"]) > 1:
            share += f" ({100 * spread[0]:.0f} to {100 * spread[1]:.0f}%)"
        lines.append(
            f"| {label} | {cell['jobs']:,} | {jct[KUMIKI]:,.0f} | {jct[NOFORECAST]:,.0f} | {jct[ORACLE]:,.0f}"
            f" | {jct[TIRESIAS]:,.0f} | {jct[SRTF]:,.0f} | {cell['kumiki_over_noforecast']:.3f}"
            f" | {cell['kumiki_over_tiresias']:.3f} | {cell['kumiki_over_srtf_oracle']:.3f}"
            f" | {100 * cell['oracle_gain_share']:.1f}% | {share}"
            f" | {cell['seeds_kumiki_at_most_noforecast']} of {len(cell['seeds'])} |"
        )
    return "\n".join(lines) + "\n"


def verdict(cells: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Issue 14's bounds over every cell of a part: how many cells meet each."""
    shares = [cell["recovered_share"] for cell in cells.values() if cell["recovered_share"] is not None]
    return {
        "cells": len(cells),
        "kumiki_at_most_noforecast": sum(cell["kumiki_over_noforecast"] <= 1.0 for cell in cells.values()),
        "kumiki_at_most_tiresias": sum(cell["kumiki_over_tiresias"] <= 1.0 for cell in cells.values()),
        "kumiki_within_srtf_bound": sum(cell["kumiki_over_srtf_oracle"] <= SRTF_BOUND for cell in cells.values()),
        "recovered_share_non_negative": sum(share >= 0 for share in shares),
        "recovered_share_mean": statistics.fmean(shares) if shares else None,
        # how far that mean could move with other cells of the same kind (percentile bootstrap, seeded)
        "recovered_share_interval": list(mean_interval(shares)) if shares else None,
        "cells_with_no_gap": len(cells) - len(shares),
    }


def verdict_line(name: str, result: Mapping[str, Any]) -> str:
    total = result["cells"]
    mean = result["recovered_share_mean"]
    bounds = result.get("recovered_share_interval")
    interval = f" (95% interval {percent(bounds[0])} to {percent(bounds[1])})" if bounds else ""
    return (
        f"{name}: kumiki <= noforecast in {result['kumiki_at_most_noforecast']} of {total} cells, <= tiresias in"
        f" {result['kumiki_at_most_tiresias']}, <= {SRTF_BOUND}x srtf-oracle in {result['kumiki_within_srtf_bound']};"
        f" recovered share >= 0 in {result['recovered_share_non_negative']} of"
        f" {total - result['cells_with_no_gap']}, mean {percent(mean)}{interval}"
    )


# ---- plot -----------------------------------------------------------------------------------------
def plot(report: Mapping[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = [(name, report[name]) for name in ("load", "mix", "shift", "week") if report.get(name)]
    fig, axes = plt.subplots(1, len(parts), figsize=(6.5 * len(parts), 4.6), squeeze=False)
    for ax, (name, cells) in zip(axes[0], parts, strict=True):
        labels = list(cells)
        xs = range(len(labels))
        for reference, marker in ((NOFORECAST, "o"), (TIRESIAS, "s"), (SRTF, "^")):
            means = [cell["avg_jct_s"][KUMIKI] / cell["avg_jct_s"][reference] for cell in cells.values()]
            ax.plot(xs, means, marker=marker, label=f"kumiki / {reference} (mean JCT over seeds)")
            for x, cell in zip(xs, cells.values(), strict=True):
                runs = cell["runs"]
                points = [runs[KUMIKI][seed]["avg_jct_s"] / runs[reference][seed]["avg_jct_s"] for seed in runs[KUMIKI]]
                ax.scatter([x] * len(points), points, s=9, color="grey", alpha=0.6, zorder=3)
        ax.axhline(1.0, color="black", linewidth=0.9)
        ax.axhline(SRTF_BOUND, color="black", linestyle=":", linewidth=0.9, label=f"{SRTF_BOUND}x (srtf-oracle bound)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=0 if name == "load" else 30, fontsize=8 if name != "week" else 6)
        ax.set_xlabel(
            {
                "load": "nodes x 8 GPUs",
                "mix": f"VC left out ({report['config']['mix_nodes']} x 8)",
                "shift": "nodes x 8 GPUs, shift",
                "week": f"the slice's days in another order ({report['config'].get('week_nodes')} x 8)",
            }[name]
        )
        ax.set_ylabel("kumiki's avg JCT / the reference's (< 1: kumiki ahead)")
        ax.set_title(f"{name}: grey dots are single seeds", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- command line ---------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="36,40,44,48,56,64,72", help="cluster sizes in 8-GPU nodes ('' for none)")
    parser.add_argument("--seeds", default="0,1,2", help="ordering seeds, comma-separated (0,1,2)")
    parser.add_argument(
        "--drop-each-queue",
        default="48",
        help="at this many nodes, rerun with each VC left out in turn ('' or 0 for none; default 48)",
    )
    parser.add_argument(
        "--shift-at",
        default="48,64",
        help=f"cluster sizes (nodes) at which to run each synthetic shift ({', '.join(SHIFTS)}); '' for none",
    )
    parser.add_argument("--weeks", default="0", help="other weeks to build from the slice's days in random orders (0)")
    parser.add_argument("--weeks-at", default="48", help="cluster size (nodes) for --weeks (48)")
    parser.add_argument("--weeks-seed", default="0", help="seed drawing the day orders of --weeks (0)")
    parser.add_argument("--workers", default=str(os.cpu_count() or 1), help="processes sharing the runs")
    parser.add_argument("--trace", default=str(PHILLY), help="job trace: a CSV path or a bundled name (kumiki.data)")
    parser.add_argument(
        "--progress-reports",
        default=None,
        metavar="MIN_GPUS",
        help="the scenario in which jobs of at least MIN_GPUS GPUs report their progress (off by default)",
    )
    parser.add_argument("--out", default="out/sim-spread", help="folder for report.json and spread.png")
    args = parser.parse_args()
    sizes = whole_numbers_or_exit(args.nodes, "--nodes", 1, parser) if args.nodes.strip() else []
    seeds = whole_numbers_or_exit(args.seeds, "--seeds", 0, parser)
    mix_nodes = whole_numbers_or_exit(args.drop_each_queue or "0", "--drop-each-queue", 0, parser)
    if len(mix_nodes) != 1:
        parser.error("--drop-each-queue takes one cluster size")
    shift_sizes = whole_numbers_or_exit(args.shift_at, "--shift-at", 1, parser) if args.shift_at.strip() else []
    workers = whole_numbers_or_exit(args.workers, "--workers", 1, parser)[0]
    weeks = whole_numbers_or_exit(args.weeks, "--weeks", 0, parser)
    week_nodes = whole_numbers_or_exit(args.weeks_at, "--weeks-at", 1, parser)
    weeks_seed = whole_numbers_or_exit(args.weeks_seed, "--weeks-seed", 0, parser)
    if len(weeks) != 1 or len(week_nodes) != 1 or len(weeks_seed) != 1:
        parser.error("--weeks, --weeks-at and --weeks-seed take one number each")
    if not sizes and not mix_nodes[0] and not shift_sizes and not weeks[0]:
        parser.error("nothing to run: give --nodes, --drop-each-queue, --shift-at or --weeks")
    reports = None
    if args.progress_reports is not None:
        reports = ProgressReports(whole_numbers_or_exit(args.progress_reports, "--progress-reports", 1, parser)[0])
    out, trace = out_and_trace_or_exit(args.out, args.trace, parser)
    try:
        orders = day_orders(trace_days(trace), weeks[0], weeks_seed[0]) if weeks[0] else []
    except ShiftError as error:
        parser.error(f"--weeks / --trace: {error}")
    if weeks[0] and not orders:
        parser.error("--weeks / --trace: the trace spans one day, so there is no other order of its days")
    for name in SHIFTS if shift_sizes else ():
        try:
            shift_trace(trace, name)
        except ShiftError as error:
            parser.error(f"--shift-at / --trace: {error}")
    for nodes in {*sizes, mix_nodes[0], *shift_sizes, *(week_nodes if orders else [])} - {0}:
        try:
            sim_jobs(trace, max_gpus=nodes * GPUS_PER_NODE, seed=seeds[0])
        except WorkloadError as error:
            parser.error(f"--nodes {nodes} / --trace: {error}")
    queues = sorted({job.queue for job in trace}) if mix_nodes[0] else []
    create_out_or_exit(out, parser)

    cells: list[Cell] = (
        [(nodes, "", "") for nodes in sizes]
        + [(mix_nodes[0], queue, "") for queue in queues]
        + [(nodes, "", shift) for nodes in shift_sizes for shift in SHIFTS]
        + [(week_nodes[0], "", DAYS_PREFIX + day_order_text(order)) for order in orders]
    )
    plan = [(cell, policy, seed) for cell in cells for seed in seeds for policy in POLICY_NAMES]
    results: dict[Cell, dict[str, dict[int, dict[str, Any]]]] = {cell: {} for cell in cells}
    started = time.perf_counter()

    def describe(arguments: tuple[Any, ...]) -> str:
        _, (nodes, drop, shift), _, _, _ = arguments
        return f"{nodes} nodes" + (f" without {drop}" if drop else f" {shift}" if shift else "")

    runs = [(str(args.trace), cell, policy, seed, reports) for cell, policy, seed in plan]
    for (_, cell, policy, seed, _), result in run_in_processes(run_one, runs, workers, describe):
        results[cell].setdefault(policy, {})[seed] = result

    load = {str(nodes): cell_summary(results[(nodes, "", "")]) for nodes in sizes}
    mix = {queue: cell_summary(results[(mix_nodes[0], queue, "")]) for queue in queues}
    shifted = {
        f"{nodes} {shift}": cell_summary(results[(nodes, "", shift)]) for nodes in shift_sizes for shift in SHIFTS
    }
    week = {
        day_order_text(order): cell_summary(results[(week_nodes[0], "", DAYS_PREFIX + day_order_text(order))])
        for order in orders
    }
    report: dict[str, Any] = {
        "config": {
            "trace": str(args.trace),
            "nodes": sizes,
            "seeds": seeds,
            "mix_nodes": mix_nodes[0] or None,
            "shift_nodes": shift_sizes,
            "week_nodes": week_nodes[0] if orders else None,
            "day_orders": [list(order) for order in orders],
            "gpus_per_node": GPUS_PER_NODE,
            "policies": list(POLICY_NAMES),
            "recovered_share": "(noforecast - kumiki) / (noforecast - oracle), mean JCT over the seeds",
            "progress_reports": None
            if reports is None
            else {"min_gpus": reports.min_gpus, "noise_sigma": reports.noise_sigma},
        },
        "load": load,
        "mix": mix,
        "shift": shifted,
        "week": week,
        "verdict": {
            name: verdict(part)
            for name, part in (("load", load), ("mix", mix), ("shift", shifted), ("week", week))
            if part
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    write_json(out / "report.json", report)
    plot(report, out / "spread.png")
    if load:
        print(markdown(f"Load: the whole slice on N x {GPUS_PER_NODE} GPUs", "nodes", load))
    if mix:
        print(markdown(f"Mix: {mix_nodes[0]} x {GPUS_PER_NODE} GPUs, one VC left out", "VC left out", mix))
    if shifted:
        print(markdown(f"Shift: the slice shifted on N x {GPUS_PER_NODE} GPUs", "nodes, shift", shifted))
    if week:
        title = f"Week: the slice's days in another order, {week_nodes[0]} x {GPUS_PER_NODE} GPUs"
        print(markdown(title, "day order", week))
    for name, result in report["verdict"].items():
        print(verdict_line(name, result))
    print(f"wall {report['wall_s']:,.0f} s; wrote {out / 'report.json'} and {out / 'spread.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
