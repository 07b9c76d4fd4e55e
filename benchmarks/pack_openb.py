"""openb fragmentation benchmark (FGD, ATC'23): `kumiki pack` with every strategy over K seeds.

One command: `.venv/bin/python benchmarks/pack_openb.py [--seeds 10] [--out DIR]`. Prints each
strategy's unallocated GPU share and its ratio to `best-fit` run in the same process, and checks
the issue's target (<= 4.4% unallocated, 30% below the reference implementation's first-fit 6.2%).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kumiki.cli.main import main as kumiki

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
TARGET = 0.044


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
    kumiki_share = report["kumiki"]["unallocated_share_mean"]
    print(f"target <= {100 * TARGET:.1f}%: {'met' if kumiki_share <= TARGET else 'missed'} ({100 * kumiki_share:.2f}%)")


if __name__ == "__main__":
    main()
