"""Simulator speed: the Philly slice at 64x8 with `kumiki`, and synthetic traces of 10k-1M jobs on 64-8,192 GPUs.

One command: `.venv/bin/python benchmarks/sim_speed.py [--max-jobs N]`. Prints CPU seconds of the
simulating process (one core), jobs per second and the ratio to `fifo` (the cheapest policy) run in
the same process on the same input.
"""

from __future__ import annotations

import argparse
import time

from kumiki.data import TRACES_DIR
from kumiki.forecast.models import build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs, synthetic_jobs

PHILLY = TRACES_DIR / "philly-slice.csv"


def timed(jobs: list[SimJobSpec], nodes: int, policy: str) -> tuple[float, int]:
    forecaster = build_default_forecaster() if POLICIES[policy].uses_forecast else None
    # CPU time of this (single-threaded) process: "on one core", and fair on a shared machine
    started = time.process_time()
    result = Simulator(uniform_cluster(nodes, 8), jobs, SimConfig(POLICIES[policy]), forecaster=forecaster).run()
    return time.process_time() - started, result.events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-jobs", type=int, default=1_000_000)
    parser.add_argument("--load", type=float, default=0.9)
    args = parser.parse_args()

    philly = sim_jobs(load_jobs(PHILLY), max_gpus=512)
    base, _ = timed(philly, 64, "fifo")
    kumiki, events = timed(philly, 64, "kumiki")
    print(
        f"philly-slice 64x8: kumiki {kumiki:.2f} s ({len(philly) / kumiki:,.0f} jobs/s, {events} events), "
        f"fifo {base:.2f} s, ratio {kumiki / base:.2f}x; target <= 10 s: {'met' if kumiki <= 10 else 'missed'}"
    )

    print("| jobs | GPUs | policy | CPU s | jobs/s | x fifo |")
    print("|---|---|---|---|---|---|")
    grid = [(10_000, 64), (10_000, 512), (10_000, 8192), (100_000, 512), (100_000, 8192), (1_000_000, 8192)]
    for count, gpus in grid:
        if count > args.max_jobs:
            continue
        jobs = synthetic_jobs(count, total_gpus=gpus, load=args.load, seed=1)
        fifo_s, _ = timed(jobs, gpus // 8, "fifo")
        for policy in ("fifo", "kumiki"):
            wall = fifo_s if policy == "fifo" else timed(jobs, gpus // 8, policy)[0]
            print(
                f"| {count:,} | {gpus:,} | {policy} | {wall:.1f} | {count / wall:,.0f} | {wall / fifo_s:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
