"""Postgres: protocols and their outbox, written together so a SIGKILL loses no step and repeats none for good."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import asyncpg

from kumiki.preemption.core import Command, Effect, Phase, Protocol, Release, Transition

_COLUMNS = [field.name for field in fields(Protocol)]
_SELECT = "SELECT " + ", ".join(_COLUMNS) + ", assignments, traceparent FROM preemption.protocols"
_UPSERT = (
    "INSERT INTO preemption.protocols ("
    + ", ".join(_COLUMNS)
    + ", assignments, traceparent) VALUES ("
    + ", ".join(f"${index}" for index in range(1, len(_COLUMNS) + 3))
    + ") ON CONFLICT (job_id, generation) DO UPDATE SET "
    + ", ".join(f"{name} = EXCLUDED.{name}" for name in _COLUMNS[2:])
    # a transition without a trace context of its own keeps the one stored (the newest command's)
    + ", traceparent = CASE WHEN EXCLUDED.traceparent = '' THEN preemption.protocols.traceparent"
    " ELSE EXCLUDED.traceparent END" + ", updated_at = now()"
)


def _protocol(row: asyncpg.Record) -> Protocol:
    values: dict[str, Any] = {name: row[name] for name in _COLUMNS}
    values["phase"] = Phase(values["phase"])
    return Protocol(**values)


@dataclass(frozen=True, slots=True)
class Stored:
    protocol: Protocol
    assignments: bytes  # the victim's PodAssignments (a serialized PreemptionCommand holding only them)
    traceparent: str = ""  # W3C traceparent of the newest command's step: later steps are its children


async def load(
    connection: asyncpg.Connection | asyncpg.Pool, job_id: str, generation: int, *, lock: bool = False
) -> Stored | None:
    row = await connection.fetchrow(
        _SELECT + " WHERE job_id = $1 AND generation = $2" + (" FOR UPDATE" if lock else ""), job_id, generation
    )
    return None if row is None else _stored(row)


def _stored(row: asyncpg.Record) -> Stored:
    return Stored(_protocol(row), bytes(row["assignments"]), row["traceparent"])


async def open_for_job(connection: asyncpg.Connection, job_id: str, *, lock: bool = False) -> list[Stored]:
    """The job's protocols still in flight (normally at most one), oldest generation first."""
    rows = await connection.fetch(
        _SELECT
        + " WHERE job_id = $1 AND phase = ANY($2::text[]) ORDER BY generation"
        + (" FOR UPDATE" if lock else ""),
        job_id,
        [Phase.CHECKPOINTING.value, Phase.EVICTING.value, Phase.REQUEUED.value],
    )
    return [_stored(row) for row in rows]


async def latest_for_job(connection: asyncpg.Connection | asyncpg.Pool, job_id: str) -> Protocol | None:
    row = await connection.fetchrow(_SELECT + " WHERE job_id = $1 ORDER BY generation DESC LIMIT 1", job_id)
    return None if row is None else _protocol(row)


async def expired(connection: asyncpg.Connection, now_unix_s: float, limit: int = 100) -> list[Stored]:
    rows = await connection.fetch(
        _SELECT + " WHERE phase = 'checkpointing' AND deadline_unix_s <= $1 ORDER BY deadline_unix_s LIMIT $2"
        " FOR UPDATE SKIP LOCKED",
        now_unix_s,
        limit,
    )
    return [_stored(row) for row in rows]


async def save(
    connection: asyncpg.Connection, transition: Transition, assignments: bytes, traceparent: str = ""
) -> None:
    """The protocol and the effects of its transition, in the caller's transaction; `traceparent` (the step
    that made the transition) goes with the effects and, when set, replaces the protocol's."""
    if not transition.changed:
        return
    protocol = transition.protocol
    await connection.execute(
        _UPSERT,
        *[getattr(protocol, name).value if name == "phase" else getattr(protocol, name) for name in _COLUMNS],
        assignments,
        traceparent,
    )
    for effect in transition.effects:
        await add_effect(connection, effect, traceparent=traceparent)


async def add_effect(
    connection: asyncpg.Connection, effect: Effect, payload: bytes = b"", *, traceparent: str = ""
) -> None:
    if isinstance(effect, Command):
        await connection.execute(
            "INSERT INTO preemption.outbox (job_id, generation, kind, action, command_id, traceparent)"
            " VALUES ($1, $2, 'command', $3, $4, $5)",
            effect.job_id,
            effect.protocol_generation,
            effect.action.value,
            effect.command_id,
            traceparent,
        )
    elif isinstance(effect, Release):
        await connection.execute(
            "INSERT INTO preemption.outbox (job_id, generation, kind, lost_gpu_seconds, traceparent)"
            " VALUES ($1, $2, 'release', $3, $4)",
            effect.job_id,
            effect.generation,
            effect.lost_gpu_seconds,
            traceparent,
        )


async def add_checkpoint_event(
    connection: asyncpg.Connection, job_id: str, generation: int, payload: bytes, traceparent: str = ""
) -> None:
    """A recorded checkpoint to publish on kumiki.checkpoints (placement's victim choice reads it)."""
    await connection.execute(
        "INSERT INTO preemption.outbox (job_id, generation, kind, payload, traceparent)"
        " VALUES ($1, $2, 'checkpoint', $3, $4)",
        job_id,
        generation,
        payload,
        traceparent,
    )


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    job_id: str
    generation: int
    kind: str
    action: str
    command_id: str
    lost_gpu_seconds: float
    payload: bytes
    traceparent: str = ""  # the step that queued it: carrying it out is a child of that step's span


async def pending_effects(pool: asyncpg.Pool, limit: int = 200) -> list[OutboxItem]:
    rows = await pool.fetch(
        "SELECT id, job_id, generation, kind, action, command_id, lost_gpu_seconds, payload, traceparent"
        " FROM preemption.outbox"
        " WHERE done_at IS NULL ORDER BY id LIMIT $1",
        limit,
    )
    return [
        OutboxItem(
            row["id"],
            row["job_id"],
            row["generation"],
            row["kind"],
            row["action"],
            row["command_id"],
            row["lost_gpu_seconds"],
            bytes(row["payload"]),
            row["traceparent"],
        )
        for row in rows
    ]


async def mark_done(connection: asyncpg.Connection | asyncpg.Pool, item_id: int) -> None:
    await connection.execute("UPDATE preemption.outbox SET done_at = now() WHERE id = $1", item_id)
