"""job.lifecycle → the GPU-second ledger, exactly once.

The bus's Postgres-offset mode (`Runtime.consume(..., exactly_once=True)`) runs this handler for a whole
fetched batch inside one transaction and stores the partition's next offset in the same transaction, so a
crash at any point either keeps the batch's ledger rows and its offset or neither. Each event is one SQL
statement. The rows are idempotent on their own too (one metered interval per job and generation), so a
record published twice by a producer retry is not counted twice either.
"""

from __future__ import annotations

from decimal import Decimal

import asyncpg

from kumiki.common.bus import Event, EventRejected
from kumiki.common.contracts.v1 import events_pb2
from kumiki.quota.adapters.convert import lifecycle_state
from kumiki.quota.core import Effect, gpus_decimal, lifecycle_effect, timestamp_micros

OPEN_SQL = (
    "INSERT INTO quota.open_intervals (job_id, generation, queue, gpu_model, priority_tier, gpus, cpu_milli,"
    " memory_mib, start_us) SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9"
    " WHERE NOT EXISTS (SELECT 1 FROM quota.ledger WHERE job_id = $1 AND generation = $2)"
    " ON CONFLICT (job_id, generation) DO NOTHING"
)

# Close the interval into the ledger and release the job's admission, in one statement. GPU-seconds are
# numeric: gpus x microseconds x 0.000001 is exact (numeric multiplication never rounds).
CLOSE_SQL = (
    "WITH closed AS (DELETE FROM quota.open_intervals WHERE job_id = $1 AND generation = $2 RETURNING *),"
    " released AS (DELETE FROM quota.holdings WHERE job_id = $1 AND generation <= $2 RETURNING 1)"
    " INSERT INTO quota.ledger (job_id, generation, queue, gpu_model, priority_tier, gpus, cpu_milli, memory_mib,"
    " start_us, end_us, gpu_seconds, final_state, event_id)"
    " SELECT job_id, generation, queue, gpu_model, priority_tier, gpus, cpu_milli, memory_mib, start_us,"
    " greatest($3, start_us), gpus * (greatest($3, start_us) - start_us) * 0.000001, $4, $5 FROM closed"
)


# Lost work of a preempted attempt, its own entry (idempotent per job and generation like the intervals).
LOST_WORK_SQL = (
    "INSERT INTO quota.lost_work (job_id, generation, queue, gpu_model, lost_gpu_seconds, at_us, reason, event_id)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (job_id, generation) DO NOTHING"
)


class LedgerHandler:
    """Meters GPU-seconds from BOUND (or a RUNNING with no BOUND before it) to completed, failed, preempted or
    released."""

    def __init__(self) -> None:
        self.applied = 0

    async def __call__(self, event: Event, connection: asyncpg.Connection | None) -> None:
        if connection is None:
            raise RuntimeError("the quota ledger consumes job.lifecycle exactly once (Postgres offsets)")
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        effect = lifecycle_effect(lifecycle_state(message.state))
        if effect is Effect.NONE:
            return
        if not message.HasField("at"):
            raise EventRejected("at: required to meter GPU-seconds")
        at_us = timestamp_micros(message.at.seconds, message.at.nanos)
        job = message.job
        if effect is Effect.OPEN:
            if not message.queue:
                raise EventRejected("queue: required to meter GPU-seconds")
            await connection.execute(
                OPEN_SQL,
                job.job_id,
                job.generation,
                message.queue,
                message.gpu_model,
                message.priority_tier,
                gpus_decimal(message.gpus),
                float(sum(pod.cpu_milli for pod in message.pods)),
                float(sum(pod.memory_mib for pod in message.pods)),
                at_us,
            )
        else:
            await connection.execute(CLOSE_SQL, job.job_id, job.generation, at_us, message.state, event.attributes.id)
            if message.state == events_pb2.JOB_STATE_PREEMPTED and message.lost_gpu_seconds > 0:
                await connection.execute(
                    LOST_WORK_SQL,
                    job.job_id,
                    job.generation,
                    message.queue,
                    message.gpu_model,
                    Decimal(repr(message.lost_gpu_seconds)),
                    at_us,
                    message.reason,
                    event.attributes.id,
                )
        self.applied += 1
