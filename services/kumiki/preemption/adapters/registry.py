"""The Postgres checkpoint registry."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from kumiki.preemption.core import CheckpointRecord, supersedes


class CheckpointRegistry:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def latest(self, job_id: str) -> CheckpointRecord | None:
        row = await self.pool.fetchrow(
            "SELECT job_id, generation, uri, step, completed_at FROM preemption.checkpoints WHERE job_id = $1", job_id
        )
        if row is None:
            return None
        return CheckpointRecord(
            row["job_id"], row["generation"], row["uri"], row["step"], row["completed_at"].timestamp()
        )

    async def record(self, report: CheckpointRecord) -> CheckpointRecord:
        """Store the report if it supersedes the latest one; return the latest after the call."""
        async with self.pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                "SELECT job_id, generation, uri, step, completed_at FROM preemption.checkpoints"
                " WHERE job_id = $1 FOR UPDATE",
                report.job_id,
            )
            current = (
                None
                if row is None
                else CheckpointRecord(
                    row["job_id"], row["generation"], row["uri"], row["step"], row["completed_at"].timestamp()
                )
            )
            if not supersedes(report, current):
                assert current is not None
                return current
            await connection.execute(
                "INSERT INTO preemption.checkpoints (job_id, generation, uri, step, completed_at)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id) DO UPDATE SET generation = EXCLUDED.generation,"
                " uri = EXCLUDED.uri, step = EXCLUDED.step, completed_at = EXCLUDED.completed_at, reported_at = now()",
                report.job_id,
                report.generation,
                report.uri,
                report.step,
                datetime.fromtimestamp(report.completed_unix_s, UTC),
            )
            return report
