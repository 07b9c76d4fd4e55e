"""What folding one node's chunk costs telemetry's stage 2 (`kumiki.telemetry.core.apply_chunk`), by what the
node's GPUs hold. One command:

    python benchmarks/telemetry_fold.py [--nodes 100] [--ticks 300] [--repeat 3]

Pure and in one process: `--nodes` nodes of 8 GPUs, one chunk per node per second for `--ticks` seconds, folded
the way the worker folds them (the chunks are built first, outside the timing). The cases:

  - held, busy reported (the baseline): four 2-GPU jobs computing at 50%, already reported on gpu.busy (a 10 s
    rule): the steady state of a busy cluster, where idle and busy tracking only check flags;
  - free: no job holds a GPU (no idle or busy tracking at all);
  - held, stretch open: the same jobs before their first busy report (a 600 s rule), summing their stretch every
    chunk: a busy job's first ten minutes on a node;
  - held zombies: the jobs at 1%, their stretch never busy (and their idle episode open) for the whole run.

Prints microseconds per node chunk (best of `--repeat`) and each case's ratio to the baseline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

from _support import ratio_table
from rich.console import Console

from kumiki.telemetry import core
from kumiki.telemetry.core import IdleRule, Inventory, InventoryGpu, NodeRecord, Reading, TelemetryConfig

GPUS = 8
JOBS_PER_NODE = 4


def node_with_jobs(node: str, held: bool) -> NodeRecord:
    inventory = Inventory(
        node, tuple(InventoryGpu(i, f"GPU-{node}-{i}", "A100", 81920, 0, False, ()) for i in range(GPUS))
    )
    record = core.apply_inventory(None, inventory)
    if held:
        per_job = GPUS // JOBS_PER_NODE
        for job in range(JOBS_PER_NODE):
            indices = tuple(range(job * per_job, (job + 1) * per_job))
            change = core.AllocationChange(node, f"{node}-job-{job}", 1, "q", indices, True)
            record = core.apply_allocation(record, change)
    return record


def fold_seconds(nodes: int, ticks: int, held: bool, utilisation: float, rule_s: float) -> float:
    """Seconds per node chunk for `ticks` one-second chunks on each of `nodes` nodes."""
    config = TelemetryConfig(idle_default=IdleRule(5.0, rule_s))
    records = {f"n{n:04d}": node_with_jobs(f"n{n:04d}", held) for n in range(nodes)}
    chunks = {
        node: [
            chunk
            for tick in range(ticks)
            for chunk in core.summarise(
                [
                    Reading(node, f"GPU-{node}-{g}", g, None, 1000.0 + tick, utilisation, 1000, 81920, None, (), "A100")
                    for g in range(GPUS)
                ],
                config.bucket_s,
            )
        ]
        for node in records
    }
    start = time.perf_counter()
    for tick in range(ticks):
        for node, record in records.items():
            records[node], _, _ = core.apply_chunk(record, chunks[node][tick], config)
    return (time.perf_counter() - start) / (ticks * nodes)


CASES = (  # label, held, utilisation %, idle rule s
    ("held, busy reported (baseline)", True, 50.0, 10.0),
    ("free", False, 0.0, 600.0),
    ("held, stretch open", True, 50.0, 600.0),
    ("held zombies", True, 1.0, 600.0),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--ticks", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.ticks < 20 or args.repeat < 1:
        parser.error("--nodes and --repeat: at least 1; --ticks: at least 20 (the baseline's jobs report busy at 10 s)")
    console = Console()
    results = {}
    with console.status("folding") as status:
        for label, held, utilisation, rule_s in CASES:
            status.update(f"folding: {label}")
            results[label] = min(
                fold_seconds(args.nodes, args.ticks, held, utilisation, rule_s) for _ in range(args.repeat)
            )
    title = f"apply_chunk, {args.nodes} nodes x {GPUS} GPUs, {args.ticks} chunks each, best of {args.repeat}"
    micros = {label: seconds * 1e6 for label, seconds in results.items()}
    console.print(ratio_table(title, ("case", "us per node chunk", "vs baseline"), micros, CASES[0][0], ".1f"))


if __name__ == "__main__":
    main()
