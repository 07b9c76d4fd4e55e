"""forecast.job_history on a real Postgres: migration 0003 mends history written when a preempted attempt's run time
was learned as a job's, and a restarted service reads back the jobs still open (`load_open_jobs`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from kumiki.common.config import DatabaseSettings
from kumiki.common.db import apply_migrations, create_pool, load_migrations
from kumiki.forecast.adapters.lifecycle import load_arrivals, load_history, load_open_jobs

PACKAGE = "kumiki.forecast.migrations"
T0 = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
async def pool(database_settings: DatabaseSettings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_settings)
    yield pool
    await pool.close()


async def migrated_to(pool: asyncpg.Pool, version: int) -> None:
    """The forecast schema as a service of that version left it (migrations up to `version`, recorded)."""
    async with pool.acquire() as connection:
        await connection.execute(
            "CREATE SCHEMA forecast; CREATE TABLE forecast.schema_migrations (version integer PRIMARY KEY,"
            " name text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in load_migrations(PACKAGE)[:version]:
            async with connection.transaction():
                await connection.execute("SET LOCAL search_path TO forecast, public")
                await connection.execute(migration.sql)
                await connection.execute(
                    "INSERT INTO forecast.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )


async def old_row(
    pool: asyncpg.Pool, job_id: str, generation: int, final_state: str | None, runtime_s: float | None
) -> None:
    at = T0 + timedelta(hours=generation)
    await pool.execute(
        "INSERT INTO forecast.job_history (job_id, generation, queue, gpus, submitted_at, finished_at, final_state,"
        " runtime_s, p50_s, p90_s, model) VALUES ($1, $2, 'research', 8, $3, $4, $5, $6, 1000, 3000, 'global')",
        job_id,
        generation,
        T0,
        at if final_state else None,
        final_state,
        runtime_s,
    )


async def test_migration_3_unlearns_preempted_attempts_and_gives_each_ending_its_whole_run_time(
    pool: asyncpg.Pool,
) -> None:
    await migrated_to(pool, 2)
    for row in (
        ("twice-preempted", 1, "preempted", 600.0),
        ("twice-preempted", 2, "preempted", 200.0),
        ("twice-preempted", 3, "completed", 300.0),
        ("run-again", 1, "completed", 100.0),  # the same job id ran again after it ended
        ("run-again", 2, "preempted", 50.0),
        ("run-again", 3, "completed", 70.0),
        ("waits", 1, "preempted", 400.0),  # preempted, its next generation queued
        ("waits", 2, None, None),
    ):
        await old_row(pool, *row)
    assert await apply_migrations(pool, "forecast", PACKAGE) == [3]
    rows = {
        (row["job_id"], row["generation"]): (row["runtime_s"], row["attempt_s"])
        for row in await pool.fetch("SELECT job_id, generation, runtime_s, attempt_s FROM forecast.job_history")
    }
    assert rows[("twice-preempted", 1)] == (None, 600.0) and rows[("twice-preempted", 2)] == (None, 200.0)
    assert rows[("twice-preempted", 3)] == (1100.0, 300.0)
    assert rows[("run-again", 1)] == (100.0, 100.0), "its first run ended before the preemption"
    assert rows[("run-again", 3)] == (120.0, 70.0), "the second run: 50 s preempted + 70 s"
    learned = sorted((job.features.job_id, job.runtime_s) for job in await load_history(pool))
    assert learned == [("run-again", 100.0), ("run-again", 120.0), ("twice-preempted", 1100.0)]

    # demand: each run once, with the run's whole run time (queued again after a preemption is no new arrival)
    arrivals = await load_arrivals(pool, T0.timestamp() - 1, T0.timestamp() + 1)
    assert sorted(arrival.duration_s or 0.0 for arrival in arrivals) == [0.0, 100.0, 120.0, 1100.0]
    assert len(await load_arrivals(pool, T0.timestamp() - 1, T0.timestamp() + 1, queue="other")) == 0

    [waiting] = await load_open_jobs(pool)
    assert waiting.features.job_id == "waits" and waiting.features.submit_s == T0.timestamp()
    assert (waiting.done_s, waiting.running_since_s) == (400.0, None), "queued again, with 400 s of work done"
    assert (waiting.given.p50_s, waiting.given.model) == (1000.0, "global")


async def test_open_jobs_are_read_back_from_their_current_run_only(pool: asyncpg.Pool) -> None:
    await apply_migrations(pool, "forecast", PACKAGE)
    started = T0 + timedelta(hours=5)
    for job_id, generation, final_state, attempt_s, lost_s, started_at in (
        ("runs", 1, "released", None, 0.0, None),  # an earlier run of the same id, cancelled
        ("runs", 2, "preempted", 900.0, 200.0, T0),
        ("runs", 3, None, None, 0.0, started),
        ("cancelled", 1, "released", None, 0.0, None),
        ("done", 1, "completed", 50.0, 0.0, T0),
    ):
        await pool.execute(
            "INSERT INTO forecast.job_history (job_id, generation, queue, gpus, submitted_at, started_at, final_state,"
            " attempt_s, lost_s, p50_s, p90_s, model) VALUES ($1, $2, 'q', 1, $3, $4, $5, $6, $7, 60, 180, 'm')",
            job_id,
            generation,
            T0 + timedelta(minutes=generation),
            started_at,
            final_state,
            attempt_s,
            lost_s,
        )
    [running] = await load_open_jobs(pool)
    assert running.features.job_id == "runs"
    assert running.features.submit_s == (T0 + timedelta(minutes=2)).timestamp(), "submitted when this run began"
    assert (running.done_s, running.running_since_s) == (700.0, started.timestamp())
