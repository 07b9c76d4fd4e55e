"""Quota admission in the simulator: which held job quota is asked for first, on the Philly slice.

    python benchmarks/sim_quota.py [--nodes 48,64] [--policy kumiki,tiresias] [--days]

Each run replays the slice through the quota service's own core (`kumiki.sim.quota`) with the live replay's
Kumiki tree: every Philly VC guaranteed its share of the cluster (philly-vc-nodes.csv), idle GPUs lent to
whoever waits, borrowed work reclaimed for an owner. Three variants per cluster size and policy, all in this
process:

- open: no quota service (what `kumiki simulate` models without --quota);
- arrival (the baseline): held jobs asked in arrival order, as placement's cycle asked before;
- policy: held jobs asked in the policy's order, the starving first (`sched.policies.admission_rank`).

The ratio is policy against arrival (below 1: the policy's order admits better). --days also runs each day of
the slice on its own and prints the spread of that ratio over the days.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from kumiki.forecast.models import build_default_forecaster
from kumiki.replay.core import plan_jobs, queue_tree
from kumiki.replay.runner import vc_weights
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator
from kumiki.sim.jobs import SimJob
from kumiki.sim.trace import DAY_S, load_jobs


class ArrivalOrder(Simulator):
    """The baseline: held jobs asked oldest first."""

    def _rank(self, job: SimJob, now: float) -> tuple[float, ...]:
        return (job.spec.submit_s,)


def average_jct(simulator: type[Simulator], specs: list[SimJobSpec], nodes: int, policy: str, tree: Any) -> float:
    forecaster = build_default_forecaster() if POLICIES[policy].uses_forecast else None
    config = SimConfig(POLICIES[policy], quota=tree)
    result = simulator(uniform_cluster(nodes, 8, island_size=8), specs, config, forecaster=forecaster).run()
    assert len(result.jobs) == len(specs), "every job must finish"
    return sum(job.jct_s for job in result.jobs) / len(result.jobs)


def variants(trace: list[Any], nodes: int, policy: str) -> dict[str, float]:
    jobs = plan_jobs(trace, gpus_per_node=8, nodes=nodes)
    specs = [SimJobSpec(job.job_id, job.submit_s, job.gpus, job.duration_s, job.queue) for job in jobs]
    tree = queue_tree(jobs, nodes * 8, vc_weights(), static=False)
    return {
        "open": average_jct(Simulator, specs, nodes, policy, None),
        "arrival": average_jct(ArrivalOrder, specs, nodes, policy, tree),
        "policy": average_jct(Simulator, specs, nodes, policy, tree),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="48,64")
    parser.add_argument("--policy", default="kumiki,tiresias")
    parser.add_argument("--days", action="store_true", help="also each day of the slice on its own")
    args = parser.parse_args()
    trace = load_jobs("philly-slice")
    print("| nodes | policy | window | open avg JCT s | arrival (baseline) | policy order | policy / arrival |")
    print("|---|---|---|---|---|---|---|")
    for nodes in (int(n) for n in args.nodes.split(",")):
        for policy in args.policy.split(","):
            started = time.perf_counter()
            whole = variants(trace, nodes, policy)
            ratio = whole["policy"] / whole["arrival"]
            print(
                f"| {nodes} x 8 | {policy} | slice | {whole['open']:,.0f} | {whole['arrival']:,.0f} |"
                f" {whole['policy']:,.0f} | {ratio:.3f} |",
                flush=True,
            )
            if not args.days:
                continue
            submits = [job.submit_s for job in trace if job.submit_s is not None]
            first, last = int(min(submits) // DAY_S), int(max(submits) // DAY_S)
            ratios = []
            for day in range(first, last + 1):
                day_jobs = [
                    job for job in trace if job.submit_s is not None and day * DAY_S <= job.submit_s < (day + 1) * DAY_S
                ]
                if not day_jobs:
                    continue
                each = variants(day_jobs, nodes, policy)
                ratios.append(each["policy"] / each["arrival"])
                print(
                    f"| {nodes} x 8 | {policy} | day {day} | {each['open']:,.0f} | {each['arrival']:,.0f} |"
                    f" {each['policy']:,.0f} | {ratios[-1]:.3f} |",
                    flush=True,
                )
            print(
                f"| {nodes} x 8 | {policy} | days: mean {statistics.mean(ratios):.3f}, min {min(ratios):.3f},"
                f" max {max(ratios):.3f} | | | | ({time.perf_counter() - started:.0f} s) |",
                flush=True,
            )


if __name__ == "__main__":
    main()
