"""`kumiki pack`: the FGD fragmentation benchmark on the openb pods and nodes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kumiki.cli.main import UsageError, message_console
from kumiki.cli.options import names_option, whole_number_option
from kumiki.sched.placement import STRATEGIES


def register(subparsers: Any) -> None:
    pack = subparsers.add_parser(
        "pack",
        help="FGD fragmentation benchmark: place pods until the cluster's GPUs are requested",
        description=(
            "Pods arrive with no departures until the requested GPUs reach the cluster's GPU capacity, repeating "
            "the pod file in shuffled order when it runs out. Seed 0 starts with the file's order; other seeds "
            "shuffle everything. A pod that does not fit is dropped and counted."
        ),
    )
    pack.add_argument("--pods", required=True, help="pod trace CSV (openb-pods.csv schema)")
    pack.add_argument("--nodes", required=True, help="node CSV (openb-nodes.csv schema)")
    pack.add_argument("--placement", required=True, help=f"comma-separated strategies ({', '.join(STRATEGIES)})")
    pack.add_argument("--out", required=True, help="output directory")
    pack.add_argument("--seeds", default="1", help="number of seeds (0..K-1), default 1")
    pack.set_defaults(handler=run_pack)


def run_pack(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kumiki.sim.pack import PackError, pack_report, prepare
    from kumiki.sim.trace import TraceError, load_jobs, load_nodes

    strategies = names_option(args.placement, "--placement", STRATEGIES)
    seeds = whole_number_option(args.seeds, "--seeds", 1)
    try:
        pods = load_jobs(args.pods)
    except TraceError as error:
        raise UsageError(f"--pods: {error}") from None
    try:
        nodes = load_nodes(args.nodes)
    except TraceError as error:
        raise UsageError(f"--nodes: {error}") from None
    try:
        problem = prepare(pods, nodes)
    except PackError as error:
        raise UsageError(str(error)) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = message_console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("pack runs", total=len(strategies) * seeds)
        report = pack_report(problem, strategies, seeds, on_run=lambda: progress.advance(task))
    report["config"] = {"pods": str(args.pods), "nodes": str(args.nodes), "seeds": seeds}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    lines = [
        "| strategy | unallocated GPU share (mean) | std | arrivals at first failure (mean) | std | failed pods |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in report["strategies"].items():
        lines.append(
            f"| {name} | {row['unallocated_share_mean']:.4f} | {row['unallocated_share_std']:.4f} | "
            f"{row['first_failure_arrival_mean']:,.1f} | {row['first_failure_arrival_std']:,.1f} | "
            f"{row['failed_pods_mean']:,.1f} |"
        )
    table = "\n".join(lines) + "\n"
    (out / "report.md").write_text(f"# Fragmentation benchmark ({seeds} seeds)\n\n{table}", encoding="utf-8")
    _plot_pack(report, out)
    console.print(table)
    console.print(f"wrote {out / 'report.json'}")
    return 0


def _plot_pack(report: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["strategies"])
    means = [100 * report["strategies"][name]["unallocated_share_mean"] for name in names]
    stds = [100 * report["strategies"][name]["unallocated_share_std"] for name in names]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, means, yerr=stds, color="#4878a8", capsize=4)
    ax.set_ylabel("GPU capacity unallocated (%)")
    ax.set_title("openb fragmentation at full request")
    fig.tight_layout()
    fig.savefig(out / "unallocated.png", dpi=90)
    plt.close(fig)
