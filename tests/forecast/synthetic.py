"""Synthetic traces with known structure, so a test knows what a good forecaster should find."""

from __future__ import annotations

import math
import random

from kumiki.sim.trace import TraceJob


def trace_job(
    job_id: str, submit_s: float, duration_s: float | None, *, queue: str = "a", gpus: float = 1.0
) -> TraceJob:
    return TraceJob(job_id, submit_s, gpus, None, None, duration_s, "", queue, "", "")


def keyed_trace(
    count: int,
    *,
    medians_s: dict[str, float],
    sigma: dict[str, float] | None = None,
    gap_s: float = 60.0,
    seed: int = 7,
) -> list[TraceJob]:
    """Jobs cycling over queues; each queue's log run time is normal around log(median) with its sigma."""
    rng = random.Random(seed)
    queues = sorted(medians_s)
    spread = sigma or {}
    jobs = []
    for index in range(count):
        queue = queues[index % len(queues)]
        duration = medians_s[queue] * math.exp(rng.gauss(0.0, spread.get(queue, 0.2)))
        jobs.append(trace_job(f"j{index}", index * gap_s, round(duration, 3), queue=queue))
    return jobs
