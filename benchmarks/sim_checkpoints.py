"""On-demand checkpointing (the live protocol) against periodic checkpoints, in the simulator, same victim choice.

    .venv/bin/python benchmarks/sim_checkpoints.py [--nodes 64] [--seed 0] [--deadline-s 300] [--ack-s 60]

The Philly slice on --nodes x 8 GPUs, for `kumiki` and `tiresias`:
- periodic (the baseline, run in the same process): every job a preemptive policy may preempt checkpoints every
  1,800 s of progress (60 s each); a victim loses its progress since the last one, plus a 60 s restore;
- on demand: no periodic checkpoints; a victim is asked to checkpoint when preempted and acknowledges after
  --ack-s (GPU time lost, the beneficiary waits that long), then pays the restore. Past --deadline-s it would be
  evicted at the deadline and lose its whole run: the last row sets the acknowledgement past the deadline.
Printed: lost GPU-hours (preemption), checkpoint GPU-hours (periodic writes), avg JCT, preemptions, and
on-demand over periodic ratios.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kumiki.data import TRACES_DIR
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.scenarios import OnDemandCheckpoint
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs


def run(policy: str, nodes: int, seed: int, on_demand: OnDemandCheckpoint | None) -> dict[str, float]:
    jobs = sim_jobs(load_jobs(TRACES_DIR / "philly-slice.csv"), max_gpus=nodes * 8, seed=seed)
    chosen = POLICIES[policy]
    forecaster = build_default_forecaster() if chosen.uses_forecast else None
    started = time.process_time()
    result = Simulator(
        uniform_cluster(nodes, 8), jobs, SimConfig(chosen, on_demand=on_demand), forecaster=forecaster
    ).run()
    return {
        "avg_jct_s": float(np.mean([job.jct_s for job in result.jobs])),
        "lost_gpu_h": sum(job.lost_gpu_s for job in result.jobs) / 3600.0,
        "checkpoint_gpu_h": sum(job.checkpoint_gpu_s for job in result.jobs) / 3600.0,
        "preemptions": float(sum(job.preemptions for job in result.jobs)),
        "cpu_s": time.process_time() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline-s", type=float, default=300.0)
    parser.add_argument("--ack-s", type=float, default=60.0)
    parser.add_argument("--policies", default="kumiki,tiresias", help="comma-separated")
    args = parser.parse_args()
    policies = [name for name in args.policies.split(",") if name]
    unknown = [name for name in policies if name not in POLICIES]
    if unknown or not policies:
        parser.error(f"--policies: unknown {unknown} (known: {', '.join(POLICIES)})")
    if args.nodes < 1 or args.deadline_s < 0 or args.ack_s < 0:
        parser.error("--nodes must be >= 1, --deadline-s and --ack-s >= 0")
    models = {
        "periodic (1,800 s)": None,
        f"on demand (ack {args.ack_s:g} s, deadline {args.deadline_s:g} s)": OnDemandCheckpoint(
            args.deadline_s, args.ack_s
        ),
        f"on demand, every ack misses the deadline ({args.deadline_s:g} s)": OnDemandCheckpoint(
            args.deadline_s, args.deadline_s + 1.0
        ),
    }
    print(f"Philly slice, {args.nodes} x 8 GPUs, seed {args.seed}", flush=True)
    print("| policy | checkpointing | lost GPU-h | checkpoint GPU-h | avg JCT s | preemptions | x periodic JCT |")
    print("|---|---|---|---|---|---|---|")
    for policy in policies:
        baseline: dict[str, float] | None = None
        for name, model in models.items():
            row = run(policy, args.nodes, args.seed, model)
            baseline = baseline or row
            ratio = row["avg_jct_s"] / baseline["avg_jct_s"]
            print(
                f"| {policy} | {name} | {row['lost_gpu_h']:,.1f} | {row['checkpoint_gpu_h']:,.1f} |"
                f" {row['avg_jct_s']:,.0f} | {row['preemptions']:,.0f} | {ratio:.3f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
