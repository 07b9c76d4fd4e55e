"""Static per-VC partitions versus one shared cluster with guarantees: the Philly slice at 64 x 8 GPUs.

    python benchmarks/sim_partitions.py [--nodes 64] [--policy kumiki] [--out DIR]

Static partitions (no borrowing): each Philly VC gets its share of the nodes (philly-vc-nodes.csv scaled to
--nodes, at least one node) and runs only its own jobs there; idle nodes of one VC never serve another.
Shared (Kumiki's borrowing and reclaim): every VC's jobs on the whole cluster, with the VC's share as its
guarantee: idle GPUs go to whoever waits (borrowing) and queues under their guarantee are served first, so
an owner gets its capacity back as borrowed jobs finish or are preempted by the policy (reclaim).
Both run the same `kumiki simulate` (same policy, placement and checkpoint model); the baseline is the
partitioned run, made in the same process.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from _support import TRACES

from kumiki.cli.main import main as kumiki


def vc_nodes() -> dict[str, int]:
    with (TRACES / "philly-vc-nodes.csv").open() as handle:
        return {row["vc"]: int(row["node num"]) for row in csv.DictReader(handle)}


def partition(nodes: int, shares: dict[str, int]) -> dict[str, int]:
    """Whole nodes per VC in proportion to its Philly nodes, at least one each, summing to `nodes`."""
    total = sum(shares.values())
    exact = {vc: nodes * count / total for vc, count in shares.items()}
    given = {vc: max(1, int(value)) for vc, value in exact.items()}
    for vc in sorted(exact, key=lambda vc: exact[vc] - int(exact[vc]), reverse=True):
        if sum(given.values()) >= nodes:
            break
        given[vc] += 1
    while sum(given.values()) > nodes:  # the minimum of one node each may overshoot: take from the largest
        largest = max(given, key=lambda vc: given[vc])
        given[largest] -= 1
    return given


def simulate(trace: Path, nodes: int, policy: str, out: Path, queues: Path | None = None) -> dict[str, float]:
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        "8",
        "--policy",
        policy,
        "--out",
        str(out),
        "--no-plots",
    ]
    if queues is not None:
        args += ["--queues", str(queues)]
    code = kumiki(args)
    if code:
        raise SystemExit(f"kumiki simulate failed ({code}) for {trace}")
    report: dict[str, float] = json.loads((out / "report.json").read_text())["policies"][policy]
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--policy", default="kumiki")
    parser.add_argument("--out", type=Path, default=Path("/tmp/kumiki-sim-partitions"))
    args = parser.parse_args()
    if args.nodes < len(vc_nodes()):
        parser.error(f"--nodes: need at least one node per VC ({len(vc_nodes())})")
    args.out.mkdir(parents=True, exist_ok=True)
    shares = vc_nodes()
    given = partition(args.nodes, shares)
    with (TRACES / "philly-slice.csv").open() as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        rows = list(reader)

    partitioned: dict[str, dict[str, float]] = {}
    too_big: dict[str, int] = {}
    for vc, node_count in given.items():
        capacity = node_count * 8
        own = [row for row in rows if row["queue"] == vc]
        fitting = [row for row in own if float(row["gpus"]) <= capacity]
        too_big[vc] = len(own) - len(fitting)
        trace = args.out / f"vc-{vc}.csv"
        with trace.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=fields)
            writer.writeheader()
            writer.writerows(fitting)
        partitioned[vc] = simulate(trace, node_count, args.policy, args.out / f"part-{vc}")

    guarantees = args.out / "guarantees.json"
    guarantees.write_text(json.dumps({vc: count * 8 for vc, count in given.items()}))
    shared = simulate(TRACES / "philly-slice.csv", args.nodes, args.policy, args.out / "shared", guarantees)

    jobs = sum(report["jobs"] for report in partitioned.values())
    avg_jct = sum(report["avg_jct_s"] * report["jobs"] for report in partitioned.values()) / jobs
    makespan = max(report["makespan_s"] for report in partitioned.values())
    busy = sum(report["gpu_utilization"] * report["makespan_s"] * given[vc] * 8 for vc, report in partitioned.items())
    utilization = busy / (makespan * args.nodes * 8)

    print("| VC | nodes | jobs | too big for the partition | static avg JCT s | shared avg JCT s |")
    print("|---|---|---|---|---|---|")
    for vc in sorted(given, key=lambda vc: -given[vc]):
        shared_queue = shared.get("per_queue", {}).get(vc, {})  # type: ignore[union-attr]
        print(
            f"| {vc} | {given[vc]} | {partitioned[vc]['jobs']:.0f} | {too_big[vc]} | "
            f"{partitioned[vc]['avg_jct_s']:,.0f} | {shared_queue.get('avg_jct_s', float('nan')):,.0f} |"
        )
    print()
    print("| layout | jobs | avg JCT s | GPU utilisation | vs static |")
    print("|---|---|---|---|---|")
    print(f"| static partitions | {jobs:.0f} | {avg_jct:,.0f} | {utilization:.3f} | 1.00x |")
    print(
        f"| shared, guarantees + borrowing | {shared['jobs']:.0f} | {shared['avg_jct_s']:,.0f} | "
        f"{shared['gpu_utilization']:.3f} | {shared['avg_jct_s'] / avg_jct:.2f}x |"
    )
    if sum(too_big.values()):
        print(
            f"\n{sum(too_big.values())} jobs are larger than their VC's partition and cannot run there at all "
            "(left out of the static averages, which flatters them)."
        )


if __name__ == "__main__":
    main()
