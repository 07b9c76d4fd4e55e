"""Turning traces into simulator jobs, and synthetic workloads shaped like Philly.

`sim_jobs` checks what the simulator needs beyond the trace schema (a submit time, a duration,
a whole number of GPUs that fits the cluster) and names the job and field that lacks it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

from kumiki.sim.engine import SimJobSpec
from kumiki.sim.scenarios import is_idle_job
from kumiki.sim.trace import TraceJob


class WorkloadError(ValueError):
    """A trace job the simulator cannot run; the message names the job and field."""


def sim_jobs(trace: Sequence[TraceJob], *, max_gpus: int, seed: int = 0, idle_share: float = 0.0) -> list[SimJobSpec]:
    """Simulator jobs in submit order; `seed` orders jobs submitted at the same second and, with an `idle_share`,
    draws the zombies (`is_idle_job`)."""
    if not 0.0 <= idle_share < 1.0:
        raise WorkloadError(f"idle share: expected 0 <= share < 1, got {idle_share:g}")
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
        jobs.append(
            SimJobSpec(
                job.job_id,
                job.submit_s,
                int(job.gpus),
                job.duration_s,
                job.queue,
                job.user,
                job.model,
                job.image,
                job.command,
                job.time_limit_s,
                is_idle_job(job.job_id, idle_share, seed),
            )
        )
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


# `featured_trace`: what each kind of script does, as (task, median run time in seconds). Evaluations are
# minutes, training runs hours; the spread between scripts of one kind is wide (sigma 1 of log run time).
_TASKS = (("eval", 600.0), ("preprocess", 1800.0), ("sweep", 3600.0), ("finetune", 7200.0), ("train", 28800.0))


def featured_trace(
    count: int,
    *,
    total_gpus: int,
    load: float = 1.0,
    seed: int = 0,
    teams: int = 4,
    users_per_team: int = 6,
    scripts_per_user: int = 5,
) -> list[TraceJob]:
    """Jobs as pods carry them, which the public traces do not: each user runs a few scripts again and again (the
    same command in the same image), some asking for a run time (a time limit, rounded up to whole hours as people
    write them, 1.5-4x what the script usually takes; a run that reaches it is stopped there), under job names
    generated afresh per submission. Within a team's queue and GPU count, run times differ by orders of magnitude
    from script to script, and little from one run of a script to the next (sigma 0.35), so a forecaster keyed
    on (queue, GPUs) cannot tell the runs apart and one keyed on the script can.

    Used to test and measure that the forecaster reads these features (`benchmarks/pod_features.py`); the
    `image`, `command` and `time_limit_s` columns of the trace schema carry them."""
    if count < 1 or total_gpus < 1 or load <= 0 or min(teams, users_per_team, scripts_per_user) < 1:
        raise WorkloadError("count, total_gpus, load, teams, users_per_team and scripts_per_user must be positive")
    rng = random.Random(seed)
    sizes = [size for size in (1, 2, 4, 8) if size <= total_gpus]
    size_weights = [0.80, 0.08, 0.07, 0.05][: len(sizes)]
    scripts: list[tuple[str, str, str, str, int, float, float | None]] = []  # queue, user, image, command, ...
    for team in range(teams):
        image = f"registry.example/team{team}/trainer:{rng.randrange(1, 20)}"
        for member in range(users_per_team):
            user = f"team{team}-user{member}"
            for script in range(scripts_per_user):
                task, typical_s = rng.choice(_TASKS)
                median_s = typical_s * rng.lognormvariate(0.0, 1.0)
                command = f"python {task}.py --config {user}/{task}-{script}.yaml"
                gpus = rng.choices(sizes, size_weights)[0]
                limit = math.ceil(median_s * rng.uniform(1.5, 4.0) / 3600.0) * 3600.0 if rng.random() < 0.6 else None
                scripts.append((f"team{team}", user, image, command, gpus, median_s, limit))
    # a user's first scripts are the ones run most (weights 1, 1/2, 1/3, ...)
    popularity = [1.0 / (1 + index % scripts_per_user) for index in range(len(scripts))]
    mean_gpu_s = sum(w * s[4] * s[5] * math.exp(0.35**2 / 2) for w, s in zip(popularity, scripts, strict=True))
    rate = load * total_gpus / (mean_gpu_s / sum(popularity))  # jobs per second
    jobs: list[TraceJob] = []
    now = 0.0
    for index in range(count):
        now += rng.expovariate(rate)
        queue, user, image, command, gpus, median_s, limit = rng.choices(scripts, popularity)[0]
        duration = max(10.0, median_s * rng.lognormvariate(0.0, 0.35))
        if limit is not None:
            duration = min(duration, limit)
        task = command.split()[1].removesuffix(".py")
        jobs.append(
            TraceJob(
                job_id=f"feat-{index}",
                submit_s=round(now, 3),
                gpus=float(gpus),
                cpus=None,
                mem_gb=None,
                duration_s=round(duration, 3),
                user=user,
                queue=queue,
                status="Pass",
                model=f"{task}-{rng.getrandbits(32):08x}",
                image=image,
                command=command,
                time_limit_s=limit,
            )
        )
    return jobs


def without_pod_features(jobs: Sequence[TraceJob]) -> list[TraceJob]:
    """The same jobs as a trace without pod features sees them: no image, command or time limit."""
    return [replace(job, image="", command="", time_limit_s=None) for job in jobs]
