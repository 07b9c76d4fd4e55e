"""Philly VCs as queues: per-queue average JCT with and without fair share, at 64 x 8 GPUs.

One command: `.venv/bin/python benchmarks/sim_queues.py [--nodes 64] [--out DIR]`. Each VC's guarantee
is its share of the Philly cluster's nodes (philly-vc-nodes.csv) applied to the simulated cluster's
GPUs. Runs `kumiki simulate` twice (the same CLI others use) and prints one table; the ratio column
is fair share over no fair share (below 1: that queue got faster).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from _support import TRACES

from kumiki.cli.main import main as kumiki


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--policies", default="fifo-backfill,kumiki")
    parser.add_argument("--out", default="/tmp/kumiki-sim-queues")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with (TRACES / "philly-vc-nodes.csv").open() as handle:
        vcs = {row["vc"]: int(row["node num"]) for row in csv.DictReader(handle)}
    total_gpus = args.nodes * 8
    shares = {vc: round(total_gpus * nodes / sum(vcs.values()), 3) for vc, nodes in vcs.items()}
    queues = out / "philly-queues.json"
    queues.write_text(json.dumps(shares, indent=2))
    common = [
        "simulate",
        "--trace",
        str(TRACES / "philly-slice.csv"),
        "--nodes",
        str(args.nodes),
        "--gpus-per-node",
        "8",
        "--policy",
        args.policies,
        "--no-plots",
    ]
    kumiki([*common, "--out", str(out / "plain")])
    kumiki([*common, "--out", str(out / "fair"), "--queues", str(queues)])
    plain = json.loads((out / "plain" / "report.json").read_text())["policies"]
    fair = json.loads((out / "fair" / "report.json").read_text())["policies"]
    names = list(plain)
    columns = " | ".join(f"{name} plain | {name} fair share | ratio" for name in names)
    print(f"| queue | guarantee GPUs | jobs | {columns} |")
    print("|---|---|---|" + "---|---|---|" * len(names))
    for queue in sorted(shares, key=lambda q: -shares[q]):
        row = plain[names[0]]["per_queue"].get(queue)
        if row is None:
            continue
        cells = []
        for name in names:
            a = plain[name]["per_queue"][queue]["avg_jct_s"]
            b = fair[name]["per_queue"][queue]["avg_jct_s"]
            cells.append(f"{a:,.0f} | {b:,.0f} | {b / a:.2f}")
        print(f"| {queue} | {shares[queue]:g} | {row['jobs']} | " + " | ".join(cells) + " |")
    for name in names:
        plain_jct, fair_jct = plain[name]["avg_jct_s"], fair[name]["avg_jct_s"]
        print(f"{name}: avg JCT plain {plain_jct:,.0f} s, fair share {fair_jct:,.0f} s ({fair_jct / plain_jct:.3f}x)")


if __name__ == "__main__":
    main()
