"""Ablations of the `kumiki` policy on the Philly slice: which part costs or buys what.

One command: `.venv/bin/python benchmarks/sim_variants.py [--nodes 64] [--seed 0] [--shift x10] [--only TEXT,...]`.
Each variant changes one field of `QueuePolicy` or, under "spread", of the ensemble forecaster's `SpreadConfig`
(how `RuntimeForecast.log_sigma` is read off residuals; those rows run `kumiki-ensemble`, every other row the
shipped forecaster, `build_default_forecaster`, as `kumiki simulate` does); the last one restores the policy
shipped before the Gittins order. Ratios are against `fifo-backfill`, `tiresias` and `srtf-oracle` run in the
same process; `tiresias` is also run with Kumiki's 24 h starvation eviction, the one rule of Kumiki's it can
take unchanged. `--shift` runs on the slice with one of issue 14's synthetic shifts (`kumiki.sim.shifts`);
`--only` keeps the variants whose names contain one of the given texts.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np

from kumiki.data import TRACES_DIR
from kumiki.forecast.models import KumikiConfig, KumikiForecaster, SpreadConfig, build_default_forecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import RuntimeForecaster
from kumiki.sched.policies import POLICIES, QueuePolicy
from kumiki.sim.engine import SimConfig, Simulator
from kumiki.sim.shifts import SHIFTS, shift_trace
from kumiki.sim.trace import TraceJob, load_jobs
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
    # since issue 14's eleventh step a starving job evicts the jobs the order values least
    "starving jobs evict the cheapest to stop (before the eleventh step)": {"starvation_by_rank": False},
    "no starvation guard (a job may wait forever)": {"starvation_s": 0.0},
    "no forecasts (kumiki-noforecast)": {"uses_forecast": False, "backfill_on_reserved": False},
    "no forecasts, no starvation guard": {"uses_forecast": False, "backfill_on_reserved": False, "starvation_s": 0.0},
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


def run(
    policy: QueuePolicy, trace: list[TraceJob], nodes: int, seed: int, spread: SpreadConfig | None = None
) -> tuple[float, float]:
    jobs = sim_jobs(trace, max_gpus=nodes * 8, seed=seed)
    forecaster: RuntimeForecaster | None = None
    if policy.uses_forecast:
        # the spread rows vary the ensemble's `SpreadConfig`; every other row runs the shipped forecaster
        forecaster = build_default_forecaster() if spread is None else KumikiForecaster(KumikiConfig(spread=spread))
    result = Simulator(uniform_cluster(nodes, 8), jobs, SimConfig(policy), forecaster=forecaster).run()
    jct = [job.jct_s for job in result.jobs]
    large = [job.jct_s for job in result.jobs if job.gpus >= 8]
    return float(np.mean(jct)), float(np.percentile(large, 99))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="orders jobs submitted in the same second")
    parser.add_argument("--shift", choices=SHIFTS, default=None, help="a synthetic shift of the slice first")
    parser.add_argument("--only", default="", help="comma-separated texts: run only variants whose name has one")
    args = parser.parse_args()
    if args.nodes < 1:
        parser.error("--nodes must be >= 1")
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    wanted = [text.strip() for text in args.only.split(",") if text.strip()]
    variants = {name: change for name, change in VARIANTS.items() if not wanted or any(t in name for t in wanted)}
    if not variants:
        parser.error(f"--only: no variant name contains any of {', '.join(wanted)}")
    trace = load_jobs(PHILLY)
    if args.shift:
        shift = shift_trace(trace, args.shift)
        trace = shift.jobs
        print(f"synthetic shift {shift.describe()}")
    backfill, backfill_p99 = run(POLICIES["fifo-backfill"], trace, args.nodes, args.seed)
    tiresias, _ = run(POLICIES["tiresias"], trace, args.nodes, args.seed)
    guarded = dataclasses.replace(
        POLICIES["tiresias"], starvation_s=POLICIES["kumiki"].starvation_s, starvation_preempts=True
    )
    tiresias_guarded, _ = run(guarded, trace, args.nodes, args.seed)
    srtf, _ = run(POLICIES["srtf-oracle"], trace, args.nodes, args.seed)
    print(
        f"fifo-backfill avg JCT {backfill:,.0f} s, p99 large {backfill_p99:,.0f} s; tiresias {tiresias:,.0f} s "
        f"({tiresias_guarded:,.0f} s with the 24 h starvation eviction); srtf-oracle {srtf:,.0f} s"
    )
    print("| variant | avg JCT s | x fifo-backfill | x tiresias | x srtf-oracle | p99 large s |")
    print("|---|---|---|---|---|---|")
    for name, variant in variants.items():
        change = dict(variant)
        spread = SpreadConfig(**change.pop("spread")) if "spread" in change else None
        mean, p99 = run(dataclasses.replace(POLICIES["kumiki"], **change), trace, args.nodes, args.seed, spread)
        ratios = f"{mean / backfill:.3f} | {mean / tiresias:.3f} | {mean / srtf:.3f}"
        print(f"| {name} | {mean:,.0f} | {ratios} | {p99:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
