"""Idle GPUs on the Philly slice: what reclaiming them is worth, and what reclaiming for any waiting job cost.

    PYTHONPATH=services .venv/bin/python benchmarks/sim_idle.py [--nodes 48,64] [--seeds 0,1,2] [--workers 2]
        [--policy fifo,fifo-backfill,tiresias,kumiki] [--idle-fraction 0.1] [--trace philly-slice] [--out out/sim-idle]

A trace says nothing of GPU use, so a share of the jobs (`--idle-fraction`, drawn per job and seed) are zombies:
they hold their GPUs for their whole run and compute nothing, as the live replay's do (`kumiki simulate
--idle-fraction`, docs/design/0018-idle-reclaim-in-the-simulator.md). Telemetry finds one 600 s into each attempt.
Per cluster size, policy and seed, all in this process:

- `kept` (the baseline): nothing reclaims them (`*=never`);
- `any waiting`: a found zombie is evicted while any job waits, whether or not its GPUs let that job start, and
  waits again where its order puts it (how placement reclaimed before; kept here as `AnyWaiting`);
- `room, idle too`: evicted only for a waiting job its GPUs let start, then waiting behind the jobs idle reclaim
  has not evicted, and that waiting job may be one idle reclaim evicted itself (the rule until 2026-12-07; kept
  here as `RoomIdleToo`);
- `room`: the same, but never for a job idle reclaim evicted that has not computed since
  (`kumiki.sched.idle.idle_victims` and `waiting_for_gpus`): the rule now.

Prints one markdown table per size (the jobs that compute: their mean average JCT over the seeds and its ratio
to `kept`; every job's; the reclaims) and writes report.json and sim-idle.png into --out.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _support import run_in_processes, simulation_grid, write_sizes_report

from kumiki.cli.main import UsageError
from kumiki.cli.options import names_option
from kumiki.cli.simulate import idle_from
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.idle import WaitingFor, parse_idle_reclaim, rule_for
from kumiki.sched.policies import POLICIES
from kumiki.sched.scheduler import Decisions
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.scenarios import IdleReclaim
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

GPUS_PER_NODE = 8
BASELINE = "kept"
RULES = {BASELINE: "*=never", "any waiting": "*=waiting:0", "room, idle too": "*=waiting:0", "room": "*=waiting:0"}


class AnyWaiting(Simulator):
    """The rule before: a found zombie past its time is evicted while any job waits, queued or held by quota."""

    def _reclaim_idle(self, now: float) -> None:
        waiting = [*self.scheduler.waiting, *(self.quota.held if self.quota is not None else ())]
        preemptions = []
        for job_id, generation in list(self.idle_due.items()):
            job = self.jobs[job_id]
            if not job.running or job.generation != generation:
                del self.idle_due[job_id]
            elif rule_for(self.config.idle.rules, job.spec.queue).reclaims(now - job.run_start_s, bool(waiting)):
                del self.idle_due[job_id]
                preemptions.append(self.scheduler.preempt(job_id, waiting[0] if waiting else "", "idle-reclaim", now))
        if preemptions:
            self.idle_reclaimed += len(preemptions)
            self._apply(Decisions(preemptions=preemptions), now)


class RoomIdleToo(Simulator):
    """The room rule before 2026-12-07 (evening): a zombie was also reclaimed for a job idle reclaim had evicted,
    which then held the GPUs idle in turn."""

    def _waiting_for_gpus(self) -> Iterator[WaitingFor]:
        queued = (
            (job, self.scheduler.waiting[job].request, False) for _, job in heapq.merge(*self.scheduler.lists.values())
        )
        held = ((job, self.jobs[job].request, True) for job in (self.quota.held if self.quota is not None else ()))
        return itertools.chain(queued, held)


VARIANTS: dict[str, type[Simulator]] = {"any waiting": AnyWaiting, "room, idle too": RoomIdleToo}


def run_one(trace: str, nodes: int, policy: str, variant: str, fraction: float, seed: int) -> dict[str, float]:
    """One simulation: average JCT of the jobs that compute, of every job, and the reclaims."""
    jobs = sim_jobs(load_jobs(trace), max_gpus=nodes * GPUS_PER_NODE, seed=seed, idle_share=fraction)
    simulator = VARIANTS.get(variant, Simulator)
    config = SimConfig(POLICIES[policy], idle=IdleReclaim(600.0, parse_idle_reclaim(RULES[variant])))
    forecaster = build_default_forecaster() if POLICIES[policy].uses_forecast else None
    result = simulator(uniform_cluster(nodes, GPUS_PER_NODE), jobs, config, forecaster=forecaster).run()
    assert len(result.jobs) == len(jobs), "every job must finish"
    return {
        "computing_s": statistics.fmean(job.jct_s for job in result.jobs if not job.idle),
        "all_s": statistics.fmean(job.jct_s for job in result.jobs),
        "reclaims": float(result.idle_reclaimed),
    }


def size_summary(runs: dict[tuple[str, str], dict[int, dict[str, float]]], seeds: list[int]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for (policy, variant), by_seed in runs.items():
        mean = {key: statistics.fmean(by_seed[seed][key] for seed in seeds) for key in ("computing_s", "all_s")}
        base = runs[(policy, BASELINE)]
        rows[f"{policy}, {variant}"] = {
            "avg_jct_s": {str(seed): by_seed[seed]["computing_s"] for seed in seeds},
            "mean_s": mean["computing_s"],
            "over_kept": mean["computing_s"] / statistics.fmean(base[seed]["computing_s"] for seed in seeds),
            "over_kept_by_seed": [by_seed[seed]["computing_s"] / base[seed]["computing_s"] for seed in seeds],
            "all_jobs_s": mean["all_s"],
            "all_over_kept": mean["all_s"] / statistics.fmean(base[seed]["all_s"] for seed in seeds),
            "reclaims": statistics.fmean(by_seed[seed]["reclaims"] for seed in seeds),
        }
    return {"rows": rows}


def markdown(nodes: int, summary: dict[str, Any]) -> str:
    lines = [
        f"### {nodes} x {GPUS_PER_NODE} GPUs (means over the seeds)",
        "",
        "| policy, reclaim | computing jobs' avg JCT s | / kept | per seed | every job's s | / kept | reclaims |",
        "|---|---:|---:|---|---:|---:|---:|",
    ]
    for name, row in summary["rows"].items():
        per_seed = ", ".join(f"{ratio:.3f}" for ratio in row["over_kept_by_seed"])
        lines.append(
            f"| {name} | {row['mean_s']:,.0f} | {row['over_kept']:.3f} | {per_seed} | {row['all_jobs_s']:,.0f} |"
            f" {row['all_over_kept']:.3f} | {row['reclaims']:,.0f} |"
        )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """Per size: each policy's reclaim variants as the computing jobs' JCT over `kept` (dots: seeds), with the
    reclaims each made written on the bar; ratios, since FIFO's JCTs are ten times the others'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    variants = [variant for variant in RULES if variant != BASELINE]
    figure, axes = plt.subplots(1, len(sizes), figsize=(6.5 * len(sizes), 4.5), squeeze=False)
    for axis, (nodes, summary) in zip(axes[0], sizes.items(), strict=True):
        policies = list(dict.fromkeys(name.split(", ")[0] for name in summary["rows"]))
        width = 0.8 / len(variants)
        for index, variant in enumerate(variants):
            xs = [position + index * width for position in range(len(policies))]
            rows = [summary["rows"][f"{policy}, {variant}"] for policy in policies]
            bars = axis.bar(xs, [row["over_kept"] for row in rows], width, label=variant, alpha=0.7)
            for x, row, bar in zip(xs, rows, bars, strict=True):
                axis.scatter([x] * len(row["over_kept_by_seed"]), row["over_kept_by_seed"], s=10, color="black")
                axis.annotate(f"{row['reclaims']:,.0f}", (x, bar.get_height()), ha="center", va="bottom", fontsize=7)
        axis.axhline(1.0, color="black", linewidth=0.9)
        axis.set_xticks([position + width * (len(variants) - 1) / 2 for position in range(len(policies))], policies)
        axis.set_ylabel("computing jobs' avg JCT / nothing reclaimed")
        axis.set_title(f"{nodes} x {GPUS_PER_NODE} GPUs (numbers: reclaims)", fontsize=9)
        axis.legend(fontsize=8)
        axis.grid(True, axis="y", alpha=0.3)
    figure.suptitle(f"Idle reclaim, {report['idle_fraction']:g} of the jobs zombies (dots: seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="fifo,fifo-backfill,tiresias,kumiki", help="policies, comma-separated")
    parser.add_argument("--idle-fraction", default="0.1", help="share of the jobs that are zombies (0 < f < 1)")
    args, sizes, seeds, workers, out, _ = simulation_grid(parser, default_out="out/sim-idle")
    try:  # the options as `kumiki simulate` checks them
        policies = names_option(args.policy, "--policy", tuple(POLICIES))
        fraction, _ = idle_from(
            argparse.Namespace(idle_fraction=args.idle_fraction, idle_after_s="600", idle_reclaim="")
        )
    except UsageError as error:
        parser.error(str(error))
    if fraction == 0:
        parser.error("--idle-fraction must be > 0: with no zombies there is nothing to reclaim")
    plan = [
        (str(args.trace), nodes, policy, variant, fraction, seed)
        for nodes in sizes
        for policy in policies
        for variant in RULES
        for seed in seeds
    ]
    started = time.perf_counter()
    runs: dict[int, dict[tuple[str, str], dict[int, dict[str, float]]]] = {nodes: {} for nodes in sizes}

    def describe(arguments: tuple[Any, ...]) -> str:
        _, nodes, policy, variant, _, seed = arguments
        return f"{nodes} x 8 {policy} {variant} seed {seed}"

    for arguments, result in run_in_processes(run_one, plan, workers, describe):
        _, nodes, policy, variant, _, seed = arguments
        runs[nodes].setdefault((policy, variant), {})[seed] = result
    for by_key in runs.values():  # the plan's order, whatever order the workers finished in
        ordered = {(policy, variant): by_key[(policy, variant)] for policy in policies for variant in RULES}
        by_key.clear()
        by_key.update(ordered)
    report = {
        "trace": str(args.trace),
        "idle_fraction": fraction,
        "seeds": seeds,
        "wall_s": time.perf_counter() - started,
        "sizes": {str(nodes): size_summary(runs[nodes], seeds) for nodes in sizes},
    }
    write_sizes_report(out, report, plot, "sim-idle.png", markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
