"""A consumer process for test_exactly_once: applies each event by incrementing a counter row in Postgres.

A duplicate delivery would show as a count of 2; a lost event as a missing row. The test SIGKILLs this
process mid-stream, so the only thing keeping counts at exactly 1 is the bus storing offsets in the same
transaction as the counter update.
"""

from __future__ import annotations

import asyncio
import sys

import asyncpg

from kumiki.common.bus import Event, EventConsumer, EventProducer
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.db import create_pool


async def apply(event: Event, connection: asyncpg.Connection | None) -> None:
    assert connection is not None
    await connection.execute(
        "INSERT INTO sink.applied (event_id, applied) VALUES ($1, 1)"
        " ON CONFLICT (event_id) DO UPDATE SET applied = sink.applied.applied + 1",
        event.attributes.id,
    )


async def main(bootstrap: str, prefix: str, database_url: str) -> None:
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix)
    pool = await create_pool(DatabaseSettings(url=database_url, pool_min=1, pool_max=4))
    async with EventProducer(kafka, "//kumiki/test-consumer") as producer:
        consumer = EventConsumer(kafka, [JOB_LIFECYCLE], "exactly-once", apply, producer, pool=pool, batch_size=200)
        await consumer.start()
        print("consuming", flush=True)
        await consumer.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
