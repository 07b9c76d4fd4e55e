"""Ablations of the `kumiki` policy on the Philly slice: which part costs or buys what.

One command: `.venv/bin/python benchmarks/sim_variants.py [--nodes 64] [--seed 0]`. Each variant changes one
field of `QueuePolicy` or, under "spread", of the forecaster's `SpreadConfig` (how `RuntimeForecast.log_sigma`
is read off residuals); the last one restores the policy shipped before the Gittins order. Ratios are against
`fifo-backfill`, `tiresias` and `srtf-oracle` run in the same process.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from kumiki.data import TRACES_DIR
from kumiki.forecast.models import KumikiConfig, KumikiForecaster, SpreadConfig
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES, QueuePolicy
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.trace import load_jobs
from kumiki.sim.workload import sim_jobs

PHILLY = TRACES_DIR / "philly-slice.csv"

VARIANTS: dict[str, dict[str, Any]] = {
    "kumiki (shipped)": {},
    "sigma read off the forecast's p90 (before log_sigma)": {"use_log_sigma": False},
    "forecast sigma fixed at 1.0 (p90 ignored)": {"forecast_sigma": 1.0},
    "spread: interquartile range of residuals": {"spread": {"low": 0.25, "high": 0.75}},
    "spread: 10% to 90% of residuals": {"spread": {"low": 0.1, "high": 0.9}},
    "spread: a key's own from 3 residuals, not 5": {"spread": {"min_residuals": 3}},
    "spread: a key's own from 10 residuals, not 5": {"spread": {"min_residuals": 10}},
    "spread: shrunk to the parent key level (30 pseudo-residuals)": {"spread": {"shrink": 30.0}},
    # `kumiki` keeps full-node jobs preemptible since issue 14; these restore the protection (`kumiki-protect`)
    "full-node jobs preemptible for 2.5 h only": {"protect_full_nodes": True, "protect_after_s": 9000.0},
    "full-node jobs preemptible for 6 h only (kumiki-protect)": {
        "protect_full_nodes": True,
        "protect_after_s": 21600.0,
    },
    "full-node jobs preemptible for 7 h only": {"protect_full_nodes": True, "protect_after_s": 25200.0},
    "full-node jobs never preemptible after 1,800 s": {"protect_full_nodes": True, "protect_after_s": 0.0},
    "rank per job, not per GPU-second": {"gpu_exponent": 0.0},
    "no wide tail mixed into forecasts": {"tail_weight": 0.0},
    # `kumiki` reads its preemption margin off the forecasts' measured errors since issue 14's ninth step
    "fixed preemption margin 4x (before the ninth step)": {"spread_margin": False},
    "fixed preemption margin 2x": {"spread_margin": False, "preempt_ratio": 2.0},
    "starving jobs reserve instead of evicting": {"starvation_preempts": False},
    "quantile ladder instead of Gittins": {"order": "forecast"},
    "previous kumiki (ladder, head reservation, 2x, protected)": {
        "order": "forecast",
        "reserve": True,
        "preempt_ratio": 2.0,
        "spread_margin": False,
        "protect_full_nodes": True,
        "protect_after_s": 0.0,
        "starvation_preempts": False,
        "gpu_exponent": 0.0,
    },
}


def run(policy: QueuePolicy, nodes: int, seed: int, spread: SpreadConfig | None = None) -> tuple[float, float]:
    jobs = sim_jobs(load_jobs(PHILLY), max_gpus=nodes * 8, seed=seed)
    config = KumikiConfig(spread=spread or SpreadConfig())
    forecaster = KumikiForecaster(config) if policy.uses_forecast else None
    result = Simulator(uniform_cluster(nodes, 8), jobs, SimConfig(policy), forecaster=forecaster).run()
    jct = [job.jct_s for job in result.jobs]
    large = [job.jct_s for job in result.jobs if job.gpus >= 8]
    return float(np.mean(jct)), float(np.percentile(large, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="orders jobs submitted in the same second")
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be >= 1")
    backfill, backfill_p99 = run(POLICIES["fifo-backfill"], args.nodes, args.seed)
    tiresias, _ = run(POLICIES["tiresias"], args.nodes, args.seed)
    srtf, _ = run(POLICIES["srtf-oracle"], args.nodes, args.seed)
    print(
        f"fifo-backfill avg JCT {backfill:,.0f} s, p99 large {backfill_p99:,.0f} s; tiresias {tiresias:,.0f} s; "
        f"srtf-oracle {srtf:,.0f} s"
    )
    print("| variant | avg JCT s | x fifo-backfill | x tiresias | x srtf-oracle | p99 large s |")
    print("|---|---|---|---|---|---|")
    for name, variant in VARIANTS.items():
        change = dict(variant)
        spread = SpreadConfig(**change.pop("spread", {}))
        mean, p99 = run(dataclasses.replace(POLICIES["kumiki"], **change), args.nodes, args.seed, spread)
        ratios = f"{mean / backfill:.3f} | {mean / tiresias:.3f} | {mean / srtf:.3f}"
        print(f"| {name} | {mean:,.0f} | {ratios} | {p99:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
