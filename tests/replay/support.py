"""Replay test helpers: small traces written in the traces' own schema (kumiki.sim.trace.TRACE_COLUMNS)."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from kumiki.sim.trace import TRACE_COLUMNS


def write_trace(path: Path, jobs: Iterable[tuple[str, float, int, float, str]]) -> Path:
    """(job id, submit s, GPUs, duration s, queue) per job; the columns the replay does not read stay empty."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(TRACE_COLUMNS)
        for job_id, submit_s, gpus, duration_s, queue in jobs:
            writer.writerow([job_id, submit_s, gpus, "", "", duration_s, "", queue, "", ""])
    return path
