"""Defragmentation moves in the simulator: each preemptive policy with and without them, on the Philly slice.

    .venv/bin/python benchmarks/sim_defrag.py [--nodes 64] [--seeds 0,1,2] [--policies kumiki,tiresias]
                                              [--checkpointing periodic,on-demand]

A defragmentation move (`kumiki.sched.scheduler.Scheduler.defragmentation`) checkpoints and moves small jobs off
the nodes a gang blocked only by fragmentation needs, when the gang's expected wait saved x its GPUs outweighs
the moved jobs' unsaved work plus restore (and, on demand, their checkpoint write) x their GPUs. The policy
without moves is the baseline, run in the same process on the same jobs (`sim_jobs` with each seed).
Printed per row: lost GPU-hours (preemption), avg JCT, avg JCT of gangs of 8+ GPUs, preemptions, defragmentation
moves, and avg JCT over the baseline's.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from kumiki.data import TRACES_DIR
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sched.scheduler import Decisions
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.scenarios import OnDemandCheckpoint
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs


class CountingSimulator(Simulator):
    """The simulator, counting preemptions by reason."""

    reasons: Counter[str]

    def _apply(self, decisions: Decisions, now: float) -> None:
        if not hasattr(self, "reasons"):
            self.reasons = Counter()
        self.reasons.update(preemption.reason for preemption in decisions.preemptions)
        super()._apply(decisions, now)


def run(policy: str, nodes: int, seed: int, on_demand: OnDemandCheckpoint | None) -> dict[str, float]:
    jobs = sim_jobs(load_jobs(TRACES_DIR / "philly-slice.csv"), max_gpus=nodes * 8, seed=seed)
    chosen = POLICIES[policy]
    forecaster = build_default_forecaster() if chosen.uses_forecast else None
    started = time.process_time()
    simulator = CountingSimulator(
        uniform_cluster(nodes, 8), jobs, SimConfig(chosen, on_demand=on_demand), forecaster=forecaster
    )
    result = simulator.run()
    reasons = getattr(simulator, "reasons", Counter())
    large = [job.jct_s for job in result.jobs if job.gpus >= 8]
    return {
        "avg_jct_s": float(np.mean([job.jct_s for job in result.jobs])),
        "large_jct_s": float(np.mean(large)) if large else 0.0,
        "lost_gpu_h": sum(job.lost_gpu_s for job in result.jobs) / 3600.0,
        "preemptions": float(sum(reasons.values())),
        "moves": float(reasons["defragmentation"]),
        "cpu_s": time.process_time() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated workload seeds")
    parser.add_argument("--policies", default="kumiki,tiresias", help="comma-separated; each needs a -defrag twin")
    parser.add_argument("--checkpointing", default="periodic,on-demand", help="periodic and/or on-demand")
    args = parser.parse_args()
    policies = [name for name in args.policies.split(",") if name]
    unknown = [name for name in policies if name not in POLICIES or f"{name}-defrag" not in POLICIES]
    if unknown or not policies:
        parser.error(f"--policies: no -defrag twin for {unknown}")
    try:
        seeds = [int(seed) for seed in args.seeds.split(",") if seed]
    except ValueError:
        parser.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    models = {"periodic": None, "on-demand": OnDemandCheckpoint(300.0, 60.0)}
    chosen_models = [name for name in args.checkpointing.split(",") if name]
    if args.nodes < 1 or not seeds or not chosen_models or any(name not in models for name in chosen_models):
        parser.error("--nodes must be >= 1, --seeds non-empty, --checkpointing periodic and/or on-demand")
    print(f"Philly slice, {args.nodes} x 8 GPUs, seeds {seeds}", flush=True)
    print(
        "| policy | checkpointing | seed | lost GPU-h | avg JCT s | avg JCT 8+ GPUs s | preemptions | moves |"
        " JCT x without |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios: dict[tuple[str, str], list[float]] = {}
    for policy in policies:
        for model_name in chosen_models:
            for seed in seeds:
                baseline = run(policy, args.nodes, seed, models[model_name])
                moved = run(f"{policy}-defrag", args.nodes, seed, models[model_name])
                for name, row in ((policy, baseline), (f"{policy}-defrag", moved)):
                    ratio = row["avg_jct_s"] / baseline["avg_jct_s"]
                    print(
                        f"| {name} | {model_name} | {seed} | {row['lost_gpu_h']:,.1f} | {row['avg_jct_s']:,.0f} |"
                        f" {row['large_jct_s']:,.0f} | {row['preemptions']:,.0f} | {row['moves']:,.0f} |"
                        f" {ratio:.3f}x |",
                        flush=True,
                    )
                ratios.setdefault((policy, model_name), []).append(moved["avg_jct_s"] / baseline["avg_jct_s"])
    for (policy, model_name), values in ratios.items():
        print(
            f"{policy} {model_name}: avg JCT with moves / without, per seed {[f'{v:.3f}' for v in values]},"
            f" mean {np.mean(values):.3f}x, min {min(values):.3f}x, max {max(values):.3f}x"
        )


if __name__ == "__main__":
    main()
