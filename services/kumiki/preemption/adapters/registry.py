"""The Postgres checkpoint registry: the newest acknowledged checkpoint of every job."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from kumiki.preemption.core import CheckpointRecord, supersedes

_SELECT = (
    "SELECT job_id, generation, uri, step, completed_at, total_steps FROM preemption.checkpoints WHERE job_id = $1"
)


def _record(row: asyncpg.Record) -> CheckpointRecord:
    completed = row["completed_at"].timestamp()
    return CheckpointRecord(row["job_id"], row["generation"], row["uri"], row["step"], completed, row["total_steps"])


class CheckpointRegistry:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def latest(self, job_id: str) -> CheckpointRecord | None:
        return await latest_in(self.pool, job_id)

    async def record(self, report: CheckpointRecord) -> CheckpointRecord:
        """Store the report if it supersedes the latest one; return the latest after the call."""
        async with self.pool.acquire() as connection, connection.transaction():
            return await record_in(connection, report)


async def latest_in(connection: asyncpg.Connection | asyncpg.Pool, job_id: str) -> CheckpointRecord | None:
    row = await connection.fetchrow(_SELECT, job_id)
    return None if row is None else _record(row)


async def record_in(connection: asyncpg.Connection, report: CheckpointRecord) -> CheckpointRecord:
    """`CheckpointRegistry.record` inside the caller's transaction."""
    row = await connection.fetchrow(_SELECT + " FOR UPDATE", report.job_id)
    current = None if row is None else _record(row)
    if not supersedes(report, current):
        assert current is not None
        return current
    await connection.execute(
        "INSERT INTO preemption.checkpoints (job_id, generation, uri, step, completed_at, total_steps)"
        " VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (job_id) DO UPDATE SET generation = EXCLUDED.generation,"
        " uri = EXCLUDED.uri, step = EXCLUDED.step, completed_at = EXCLUDED.completed_at,"
        " total_steps = EXCLUDED.total_steps, reported_at = now()",
        report.job_id,
        report.generation,
        report.uri,
        report.step,
        datetime.fromtimestamp(report.completed_unix_s, UTC),
        report.total_steps,
    )
    return report
