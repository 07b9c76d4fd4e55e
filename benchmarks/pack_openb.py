"""openb fragmentation benchmark (FGD, ATC'23): `kumiki pack` with every strategy over K seeds.

One command: `.venv/bin/python benchmarks/pack_openb.py [--seeds 10] [--out DIR]`. Prints each
strategy's unallocated GPU share and its ratio to `best-fit` run in the same process, checks the
issue's target (<= 4.4% unallocated, 30% below the reference implementation's first-fit 6.2%), shows
the FGD artifact's own figures at the same end point for context, and times one seed per strategy.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _support import TRACES

from kumiki.cli.main import main as kumiki
from kumiki.sim.pack import prepare, run_pack
from kumiki.sim.trace import load_jobs, load_nodes

TARGET = 0.044
# hkust-adsl/kubernetes-scheduler-simulator, experiments/analysis/expected_results/analysis_allo_discrete.csv,
# openb_pod_list_default at 100% arrived GPU workload (GPU allocation 95.14% / 95.06% for FGD and
# 92.94% for BestFit, seeds 42-43): the published FGD itself leaves about 4.9% unallocated here
PUBLISHED = {"FGD (artifact)": 0.049, "BestFit (artifact, CPU+GPU score)": 0.071}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="10")
    parser.add_argument("--out", default="/tmp/kumiki-pack-openb")
    args = parser.parse_args()
    kumiki(
        [
            "pack",
            "--pods",
            str(TRACES / "openb-pods.csv"),
            "--nodes",
            str(TRACES / "openb-nodes.csv"),
            "--placement",
            "spread,best-fit,first-fit,kumiki",
            "--seeds",
            args.seeds,
            "--out",
            args.out,
        ]
    )
    report = json.loads((Path(args.out) / "report.json").read_text())["strategies"]
    base = report["best-fit"]["unallocated_share_mean"]
    for name, row in report.items():
        share = row["unallocated_share_mean"]
        print(
            f"{name}: {100 * share:.2f}% +- {100 * row['unallocated_share_std']:.2f} unallocated, "
            f"{share / base:.2f}x best-fit, first failure at arrival {row['first_failure_arrival_mean']:,.0f}"
        )
    for name, share in PUBLISHED.items():
        print(f"{name}: about {100 * share:.1f}% unallocated (published, not run here)")
    kumiki_share = report["kumiki"]["unallocated_share_mean"]
    print(f"target <= {100 * TARGET:.1f}%: {'met' if kumiki_share <= TARGET else 'missed'} ({100 * kumiki_share:.2f}%)")
    problem = prepare(load_jobs(TRACES / "openb-pods.csv"), load_nodes(TRACES / "openb-nodes.csv"))
    for name in report:
        start = time.process_time()
        run_pack(problem, name, 0)
        print(f"{name}: {time.process_time() - start:.1f} s CPU for seed 0")


if __name__ == "__main__":
    main()
