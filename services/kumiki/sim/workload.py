"""Turning traces into simulator jobs, and synthetic workloads shaped like Philly.

`sim_jobs` checks what the simulator needs beyond the trace schema (a submit time, a duration,
a whole number of GPUs that fits the cluster) and names the job and field that lacks it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from kumiki.sim.engine import SimJobSpec
from kumiki.sim.trace import TraceJob


class WorkloadError(ValueError):
    """A trace job the simulator cannot run; the message names the job and field."""


def sim_jobs(trace: Sequence[TraceJob], *, max_gpus: int, seed: int = 0) -> list[SimJobSpec]:
    """Simulator jobs in submit order; `seed` orders jobs submitted at the same second."""
    jobs: list[SimJobSpec] = []
    for job in trace:
        if job.submit_s is None:
            raise WorkloadError(f"job {job.job_id}: field 'submit_s' is empty; the simulator needs it")
        if job.duration_s is None:
            raise WorkloadError(f"job {job.job_id}: field 'duration_s' is empty; the simulator needs it")
        if job.gpus != int(job.gpus) or job.gpus < 1:
            raise WorkloadError(
                f"job {job.job_id}: field 'gpus' must be a whole number >= 1 here, got {job.gpus:g} "
                "(fractional pods belong to `kumiki pack`)"
            )
        if job.gpus > max_gpus:
            raise WorkloadError(f"job {job.job_id}: field 'gpus' is {job.gpus:g}, more than the cluster's {max_gpus}")
        jobs.append(SimJobSpec(job.job_id, job.submit_s, int(job.gpus), job.duration_s, job.queue, job.user, job.model))
    rng = random.Random(seed)
    tie_break = {job.job_id: (rng.random() if seed else float(index)) for index, job in enumerate(jobs)}
    jobs.sort(key=lambda job: (job.submit_s, tie_break[job.job_id]))
    return jobs


def synthetic_jobs(
    count: int, *, total_gpus: int, load: float = 1.0, seed: int = 0, queues: int = 8, gpus_per_node: int = 8
) -> list[SimJobSpec]:
    """A Philly-like workload: mostly 1-GPU jobs, log-normal heavy-tailed durations, Poisson arrivals at `load`."""
    if count < 1 or total_gpus < 1 or load <= 0:
        raise WorkloadError("count, total_gpus and load must be positive")
    rng = random.Random(seed)
    sizes = [1, 2, 4, 8, 16]
    weights = [0.90, 0.03, 0.04, 0.025, 0.005]
    sizes_weights = [(size, weight) for size, weight in zip(sizes, weights, strict=True) if size <= total_gpus]
    allowed = [size for size, _ in sizes_weights]
    allowed_weights = [weight for _, weight in sizes_weights]
    mean_log, sigma = math.log(900.0), 2.0
    mean_duration = math.exp(mean_log + sigma**2 / 2)
    mean_gpus = sum(s * w for s, w in sizes_weights) / sum(allowed_weights)
    rate = load * total_gpus / (mean_gpus * mean_duration)  # jobs per second
    jobs: list[SimJobSpec] = []
    now = 0.0
    for index in range(count):
        now += rng.expovariate(rate)
        gpus = rng.choices(allowed, allowed_weights)[0]
        gpus = min(gpus, total_gpus)
        duration = min(max(rng.lognormvariate(mean_log, sigma), 10.0), 30 * 86400.0)
        queue = f"q{rng.randrange(queues)}"
        jobs.append(SimJobSpec(f"syn-{index}", round(now, 3), gpus, round(duration, 3), queue))
    del gpus_per_node
    return jobs
