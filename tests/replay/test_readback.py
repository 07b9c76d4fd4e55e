"""What the fault run reads back from a real Apache Kafka and a real Postgres: the end checks stand on these."""

from __future__ import annotations

import uuid
from decimal import Decimal

import asyncpg
from aiokafka import AIOKafkaConsumer

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.db import apply_migrations, create_pool
from kumiki.replay.readback import group_lag, quota_ledger, read_topic, topic_partitions


def _events(count: int) -> list[tuple[str, events_pb2.JobLifecycle]]:
    return [
        (f"job-{index}", events_pb2.JobLifecycle(job=common_pb2.JobRef(job_id=f"job-{index}", generation=1)))
        for index in range(count)
    ]


async def _migrated(database: DatabaseSettings) -> None:
    """The bus's consumer offsets and the quota ledger, as the services create them."""
    pool = await create_pool(database)
    try:
        await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
        await apply_migrations(pool, "quota", "kumiki.quota.migrations")
    finally:
        await pool.close()


async def test_read_topic_returns_every_record_once_in_log_order_and_nothing_for_a_missing_topic(
    kafka: KafkaSettings,
) -> None:
    await ensure_topics(kafka, [JOB_LIFECYCLE])
    topic = JOB_LIFECYCLE.full_name(kafka.topic_prefix)
    assert await read_topic(kafka, topic) == []  # created, still empty
    async with EventProducer(kafka, "//kumiki/test") as producer:
        await producer.publish_many(JOB_LIFECYCLE, _events(40))

    records = await read_topic(kafka, topic)

    assert sorted(record.key for record in records) == sorted(f"job-{i}".encode() for i in range(40))
    by_partition: dict[int, list[int]] = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record.offset)
    assert len(by_partition) > 1  # the keys spread over partitions, and each is read whole, in order
    assert all(offsets == list(range(len(offsets))) for offsets in by_partition.values())
    assert await read_topic(kafka, kafka.topic_prefix + "never-created") == []


async def test_group_lag_counts_from_the_committed_offsets_and_postgres_overrides_kafka(
    kafka: KafkaSettings, database_settings: DatabaseSettings
) -> None:
    await ensure_topics(kafka, [JOB_LIFECYCLE])
    await _migrated(database_settings)
    topic = JOB_LIFECYCLE.full_name(kafka.topic_prefix)
    async with EventProducer(kafka, "//kumiki/test") as producer:
        await producer.publish_many(JOB_LIFECYCLE, _events(60))
    probe = AIOKafkaConsumer(**kafka.client_options(), group_id=None, enable_auto_commit=False)
    await probe.start()
    try:
        partitions = await topic_partitions(probe, topic)
        ends = await probe.end_offsets(partitions)
    finally:
        await probe.stop()
    first, *others = [tp for tp in partitions if ends[tp] > 1]
    kafka_group, db_group = f"test-kafka-{uuid.uuid4().hex[:8]}", f"test-db-{uuid.uuid4().hex[:8]}"
    committer = AIOKafkaConsumer(**kafka.client_options(), group_id=kafka_group, enable_auto_commit=False)
    await committer.start()
    try:
        committer.assign(partitions)
        await committer.commit({tp: ends[tp] for tp in partitions if tp != first} | {first: 1})
    finally:
        await committer.stop()
    connection = await asyncpg.connect(database_settings.url)
    try:  # the exactly-once consumers keep their offsets in Postgres: one group only there, one in both
        rows = [(db_group, topic, tp.partition, ends[tp]) for tp in partitions]
        rows.append((kafka_group, topic, others[0].partition, 0))
        await connection.executemany(
            "INSERT INTO kumiki_bus.consumer_offsets (group_id, topic, partition, next_offset) VALUES ($1, $2, $3, $4)",
            rows,
        )
    finally:
        await connection.close()

    lag = await group_lag(kafka, database_settings)

    assert lag[db_group] == {}  # at the end of every partition
    assert lag[kafka_group] == {
        f"{topic}[{first.partition}]": ends[first] - 1,
        f"{topic}[{others[0].partition}]": ends[others[0]],  # Postgres says 0 where Kafka says the end
    }


async def test_quota_ledger_reads_only_the_run_s_jobs_and_counts_open_intervals(
    database_settings: DatabaseSettings,
) -> None:
    await _migrated(database_settings)
    connection = await asyncpg.connect(database_settings.url)
    try:
        closed = "INSERT INTO quota.ledger (job_id, generation, queue, gpu_model, priority_tier, gpus, start_us,"
        closed += " end_us, gpu_seconds, final_state, event_id) VALUES ($1, $2, 'q', 'A100', 0, 1, 0, 1, $3, 4, $1)"
        await connection.executemany(
            closed, [("run-a", 1, Decimal("1.000001")), ("run-a", 2, Decimal("2")), ("other-a", 1, Decimal("9"))]
        )
        await connection.execute(
            "INSERT INTO quota.open_intervals (job_id, generation, queue, gpu_model, priority_tier, gpus, start_us)"
            " VALUES ('run-b', 1, 'q', 'A100', 0, 8, 0), ('other-b', 1, 'q', 'A100', 0, 8, 0)"
        )
    finally:
        await connection.close()

    rows, still_open = await quota_ledger(database_settings, "run-")

    assert rows == {("run-a", 1): Decimal("1.000001"), ("run-a", 2): Decimal("2")}
    assert still_open == 1
