"""Ledger ingest: job.lifecycle events/s into the quota ledger, through the real broker and Postgres.

    python benchmarks/quota_ingest.py --bootstrap HOST:PORT --database-url postgresql://... [--events 50000]

Both runs use the bus's exactly-once mode (offsets in the ledger's transaction) and the service's
LedgerHandler on the same events, each into a fresh database. Kumiki's path applies a whole fetched batch
(up to 500 records per partition) per transaction; the baseline is the naive consumer, one transaction per
event (batch size 1), run on --naive-events of them. Both ledgers must hold the same GPU-seconds per event.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
import uuid
from decimal import Decimal

import asyncpg
from _support import broker
from rich.console import Console
from rich.table import Table

from kumiki.common.bus import EventConsumer, EventProducer, ensure_topics
from kumiki.common.bus.topics import DEAD_LETTER, JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.db import apply_migrations, create_pool
from kumiki.quota.adapters.ledger import LedgerHandler

console = Console()


def lifecycle_events(count: int, seed: int = 1) -> list[tuple[str, events_pb2.JobLifecycle]]:
    rng = random.Random(seed)
    items: list[tuple[str, events_pb2.JobLifecycle]] = []
    base = 1_790_000_000
    index = 0
    while len(items) < count:
        job = f"job-{index}"
        start = base + rng.randrange(0, 86_400)
        gpus = rng.choice((1.0, 2.0, 8.0))
        for state, at in ((events_pb2.JOB_STATE_RUNNING, start), (events_pb2.JOB_STATE_COMPLETED, start + 600)):
            message = events_pb2.JobLifecycle(
                job=common_pb2.JobRef(job_id=job, generation=1),
                state=state,
                queue=f"org/team-{index % 8}",
                gpus=gpus,
                gpu_model="A100",
            )
            message.at.seconds = at
            items.append((job, message))
        index += 1
    return items[:count]


async def fresh_database(admin_url: str) -> tuple[DatabaseSettings, str]:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    base, _, _ = admin_url.rpartition("/")
    return DatabaseSettings(url=f"{base}/{name}", pool_min=1, pool_max=4), name


async def drop_database(admin_url: str, name: str) -> None:
    admin = await asyncpg.connect(admin_url)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def ingest(kafka: KafkaSettings, admin_url: str, count: int, batch_size: int) -> tuple[float, Decimal]:
    """events/s from the first handled record to the count-th, and the ledger's GPU-seconds."""
    database, name = await fresh_database(admin_url)
    pool = await create_pool(database)
    try:
        await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
        await apply_migrations(pool, "quota", "kumiki.quota.migrations")
        async with EventProducer(kafka, "//kumiki/bench") as producer:
            consumer = EventConsumer(
                kafka, [JOB_LIFECYCLE], f"bench-{uuid.uuid4().hex[:6]}", LedgerHandler(), producer,
                pool=pool, batch_size=batch_size,
            )  # fmt: skip
            await consumer.start()
            task = asyncio.create_task(consumer.run())
            while consumer.handled == 0:
                await asyncio.sleep(0.01)
            started, first = time.perf_counter(), consumer.handled
            while consumer.handled < count:
                await asyncio.sleep(0.01)
                if task.done():
                    task.result()
            elapsed = time.perf_counter() - started
            consumer.request_stop()
            await task
            await consumer.stop()
        total = await pool.fetchval("SELECT coalesce(sum(gpu_seconds), 0) FROM quota.ledger")
        return (count - first) / elapsed, Decimal(total)
    finally:
        await pool.close()
        await drop_database(admin_url, name)


async def main(args: argparse.Namespace) -> None:
    with broker(args.bootstrap) as bootstrap:
        results = {}
        for label, count, batch in (("kumiki: batch per transaction", args.events, 500),
                                    ("naive: one transaction per event", args.naive_events, 1)):  # fmt: skip
            kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-{uuid.uuid4().hex[:8]}.")
            await ensure_topics(kafka, [JOB_LIFECYCLE, DEAD_LETTER])
            async with EventProducer(kafka, "//kumiki/bench") as producer:
                await producer.publish_many(JOB_LIFECYCLE, lifecycle_events(count))
            rate, total = await ingest(kafka, args.database_url, count, batch)
            expected = sum(Decimal(repr(m.gpus)) * 600 for _, m in lifecycle_events(count)[1::2])
            assert total == expected, f"{label}: ledger {total} != {expected}"
            results[label] = (count, rate)
    table = Table(title="quota ledger ingest (exactly once, real broker and Postgres)")
    for column in ("path", "events", "events/s", "vs naive"):
        table.add_column(column)
    naive = results["naive: one transaction per event"][1]
    for label, (count, rate) in results.items():
        table.add_row(label, f"{count:,}", f"{rate:,.0f}", f"{rate / naive:.1f}x")
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"))
    parser.add_argument("--database-url", default=os.environ.get("KUMIKI_DATABASE_URL"), required=False)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--naive-events", type=int, default=5_000)
    arguments = parser.parse_args()
    if not arguments.database_url:
        parser.error("--database-url (or KUMIKI_DATABASE_URL): a Postgres where databases may be created")
    asyncio.run(main(arguments))
