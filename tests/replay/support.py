"""Replay test helpers: small traces written in the traces' own schema (kumiki.sim.trace.TRACE_COLUMNS), and
`kumiki replay` run on a test's stack."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kumiki.sim.trace import TRACE_COLUMNS


def write_trace(path: Path, jobs: Iterable[tuple[str, float, int, float, str]]) -> Path:
    """(job id, submit s, GPUs, duration s, queue) per job; the columns the replay does not read stay empty."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        for job_id, submit_s, gpus, duration_s, queue in jobs:
            writer.writerow([job_id, submit_s, gpus, "", "", duration_s, "", queue, "", ""])
    return path


def replayed(home: Path, out: Path, *options: str, timeout: float = 300) -> dict[str, Any]:
    """`kumiki replay OPTIONS --out OUT` on the stack in `home`, which must exit 0: its results.json."""
    from tests.devstack.test_stack import kumiki

    run = kumiki(home, "replay", *options, "--out", str(out), timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results
