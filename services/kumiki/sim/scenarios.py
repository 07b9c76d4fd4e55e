"""What the simulator plays that a trace does not carry: how a victim answers a request to checkpoint
(`OnDemandCheckpoint`, the live protocol), which jobs report how far they have got (`ProgressReports`), and which
hold GPUs they do not use and what is done about it (`is_idle_job`, `IdleReclaim`). The live replay reads the same
definitions, so it and its simulated counterpart play the same scenario."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kumiki.sched.idle import IdlePolicy, rule_for

# `gittins` order: a running job is looked at again when its progress reaches 1,800 s, 3,600 s, 7,200 s, ...
RANK_CHECK_FIRST_S = 1800.0


@dataclass(frozen=True, slots=True)
class OnDemandCheckpoint:
    """The live protocol (docs/preemption.md): no periodic checkpoints; a victim is asked to checkpoint when it is
    preempted. It acknowledges after `ack_s` (writing, not training; the beneficiary's start waits that long);
    if that is past `deadline_s` it is evicted at the deadline and loses everything since it (re)started."""

    deadline_s: float = 300.0
    ack_s: float = 60.0

    def __post_init__(self) -> None:
        if self.deadline_s < 0 or self.ack_s < 0:
            raise ValueError("on-demand checkpoint deadline and acknowledgement time must be >= 0 s")

    @property
    def answers(self) -> bool:
        return self.ack_s <= self.deadline_s

    @property
    def held_s(self) -> float:
        """How long the victim keeps its GPUs after the decision."""
        return self.ack_s if self.answers else self.deadline_s


def progress_marks(duration_s: float, first_s: float = RANK_CHECK_FIRST_S) -> list[float]:
    """The progress points, `first_s` x 2^k before a job's end, where a running job's rank is looked at again and a
    job that reports its progress reports (here and in the live replay)."""
    if first_s <= 0:
        raise ValueError(f"first_s must be > 0, got {first_s}")
    marks = []
    mark = first_s
    while mark < duration_s:
        marks.append(mark)
        mark *= 2.0
    return marks


class Submitted(Protocol):
    """What choosing the jobs that report reads of a job (a `SimJobSpec`, or the live replay's `ReplayJob`)."""

    @property
    def job_id(self) -> str: ...
    @property
    def submit_s(self) -> float: ...
    @property
    def gpus(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ProgressReports:
    """Which jobs report how far they have got, and how well (a scenario: a trace carries no progress).

    Jobs of at least `min_gpus` GPUs report, a `share` of them (drawn with `seed`), each time the scheduler
    looks at their rank again (their progress doubling from 1,800 s). A report is off by a factor fixed per job,
    e^N(0, `noise_sigma`): the rate it ran at early is not the rate it ends at (data loading, evaluation)."""

    min_gpus: int = 1
    share: float = 1.0
    noise_sigma: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if self.min_gpus < 1:
            raise ValueError(f"progress reports: min_gpus must be >= 1, got {self.min_gpus}")
        if not 0.0 <= self.share <= 1.0:
            raise ValueError(f"progress reports: share must be in [0, 1], got {self.share}")
        if not self.noise_sigma >= 0.0:
            raise ValueError(f"progress reports: noise_sigma must be >= 0, got {self.noise_sigma}")

    def describe(self) -> str:
        return (
            f"Progress reports (a scenario, not in the trace): {self.share:.0%} of the jobs of >= {self.min_gpus} GPUs"
            f" report, each off by e^N(0, {self.noise_sigma:g})"
        )

    def reporters(self, jobs: Sequence[Submitted]) -> dict[str, float]:
        """job -> the factor its reports are off by, for the jobs that report (drawn in submit order; the live
        replay draws from its jobs with the same seed, so it and its simulated counterpart pick the same ones)."""
        rng = random.Random(self.seed)
        chosen: dict[str, float] = {}
        for job in sorted(jobs, key=lambda job: (job.submit_s, job.job_id)):
            reports = rng.random() < self.share
            factor = math.exp(rng.gauss(0.0, self.noise_sigma))
            if reports and job.gpus >= self.min_gpus:
                chosen[job.job_id] = factor
        return chosen


def is_idle_job(job_id: str, share: float, seed: int = 0) -> bool:
    """Whether a job is a zombie: it holds its GPUs for its whole run and computes nothing (a notebook left open, a
    job hung on its input). A trace says nothing of GPU use, so a `share` of the jobs are drawn. Each job's draw
    is its own (`seed` and the job's ID), so a day cut from a trace holds the zombies it held in the whole, and the
    live replay and its simulated counterpart draw the same ones."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"idle share: expected 0 <= share < 1, got {share}")
    return share > 0.0 and random.Random(f"idle:{seed}:{job_id}").random() < share


@dataclass(frozen=True, slots=True)
class IdleReclaim:
    """What becomes of a zombie's GPUs. Telemetry finds a zombie `found_after_s` into each attempt (its rule: that
    long below the utilisation threshold); placement then reclaims it by its queue's rule (`rules`, as
    KUMIKI_PLACEMENT_IDLE_RECLAIM; none: never), evicting it to wait again, as any victim does."""

    found_after_s: float = 600.0
    rules: Mapping[str, IdlePolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.found_after_s > 0:
            raise ValueError(f"idle reclaim: found_after_s must be > 0, got {self.found_after_s}")

    def due_after_s(self, queue: str) -> float | None:
        """Seconds into an attempt at which the queue's rule may reclaim a zombie; None if it never does."""
        rule = rule_for(self.rules, queue)
        return None if rule.mode == "never" else max(self.found_after_s, rule.idle_s)
