"""Checkpoint bookkeeping rules, pure: which report becomes a job's latest checkpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    job_id: str
    generation: int
    uri: str
    step: int
    completed_unix_s: float


def validate_report(job_id: str, generation: int, uri: str, completed_unix_s: float) -> list[tuple[str, str]]:
    """Problems as (field, problem) pairs; empty when the report is acceptable."""
    problems = []
    if not job_id:
        problems.append(("job.job_id", "required"))
    if generation < 1:
        problems.append(("job.generation", "must be >= 1"))
    if not uri:
        problems.append(("uri", "required"))
    if completed_unix_s <= 0:
        problems.append(("completed_at", "required"))
    return problems


def supersedes(new: CheckpointRecord, current: CheckpointRecord | None) -> bool:
    """A report becomes the latest when it is from a newer generation or a later step of the same one."""
    if current is None:
        return True
    return (new.generation, new.step, new.completed_unix_s) > (
        current.generation,
        current.step,
        current.completed_unix_s,
    )


def lost_work_seconds(now_unix_s: float, started_unix_s: float, latest: CheckpointRecord | None) -> float:
    """Work lost if the job stops now: time since its last checkpoint (or since it started)."""
    since = max(started_unix_s, latest.completed_unix_s) if latest else started_unix_s
    return max(0.0, now_unix_s - since)
