"""Reading back what Apache Kafka and Postgres hold. The fault-injection run's end checks trust these reads,
not what the services say: a topic's records to its end, every consumer group's lag, the quota ledger."""

from __future__ import annotations

import asyncio
import time
from decimal import Decimal

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord

from kumiki.common.bus.admin import start_client
from kumiki.common.config import DatabaseSettings, KafkaSettings


async def read_topic(kafka: KafkaSettings, topic: str) -> list[ConsumerRecord]:
    """Every record of a topic up to its end offsets now, partition after partition (each in log order)."""
    consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False, group_id=None)
    await start_client(consumer, kafka)
    try:
        partitions = await topic_partitions(consumer, topic)
        if not partitions:
            return []
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        records: dict[TopicPartition, list[ConsumerRecord]] = {tp: [] for tp in partitions}
        deadline = time.monotonic() + 300
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} to its end took more than 300 s")
            for tp, batch in (await consumer.getmany(timeout_ms=500, max_records=5000)).items():
                records[tp].extend(record for record in batch if record.offset < ends[tp])
        return [record for tp in partitions for record in records[tp]]
    finally:
        await consumer.stop()


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 30.0) -> list[TopicPartition]:
    """The topic's partitions from fresh metadata (empty when the topic does not exist)."""
    deadline = time.monotonic() + timeout_s
    while True:
        cluster = await consumer._client.fetch_all_metadata()  # consumer.topics() drops the partitions it read
        if topic not in cluster.topics():
            return []
        found = cluster.partitions_for_topic(topic)
        if found:
            return [TopicPartition(topic, p) for p in sorted(found)]
        if time.monotonic() > deadline:
            raise TimeoutError(f"no partition metadata for {topic} within {timeout_s:.0f} s")
        await asyncio.sleep(0.5)


async def group_lag(kafka: KafkaSettings, database: DatabaseSettings) -> dict[str, dict[str, int]]:
    """Per consumer group, the records between its committed offset and the end of each partition it has
    committed on (Postgres offsets where the group keeps them there: those are the truth, Kafka's a copy)."""
    admin = AIOKafkaAdminClient(**kafka.client_options(), request_timeout_ms=15000)
    await admin.start()
    consumer = AIOKafkaConsumer(**kafka.client_options(), enable_auto_commit=False, group_id=None)
    await start_client(consumer, kafka)
    connection = await asyncpg.connect(database.url)
    try:
        stored: dict[tuple[str, str, int], int] = {}
        for row in await connection.fetch(
            "SELECT group_id, topic, partition, next_offset FROM kumiki_bus.consumer_offsets"
        ):
            stored[(row["group_id"], row["topic"], row["partition"])] = row["next_offset"]
        groups = sorted({group[0] for group in await admin.list_consumer_groups()} | {g for g, _, _ in stored})
        lag: dict[str, dict[str, int]] = {}
        for group in groups:
            committed = {tp: meta.offset for tp, meta in (await admin.list_consumer_group_offsets(group)).items()}
            for (owner, topic, partition), offset in stored.items():
                if owner == group:
                    committed[TopicPartition(topic, partition)] = offset
            topics = {tp.topic for tp in committed}
            every = [tp for topic in sorted(topics) for tp in await topic_partitions(consumer, topic)]
            ends = await consumer.end_offsets(every) if every else {}
            behind = {}
            for tp in every:
                missing = ends[tp] - max(0, committed.get(tp, 0))
                if missing > 0:
                    behind[f"{tp.topic}[{tp.partition}]"] = missing
            lag[group] = behind
        return lag
    finally:
        await connection.close()
        await consumer.stop()
        await admin.close()


async def quota_ledger(database: DatabaseSettings, prefix: str) -> tuple[dict[tuple[str, int], Decimal], int]:
    """The quota ledger's GPU-seconds per (job, generation) for jobs whose ids start with `prefix`, and how many
    of their intervals are still open."""
    connection = await asyncpg.connect(database.url)
    try:
        rows = await connection.fetch(
            "SELECT job_id, generation, gpu_seconds FROM quota.ledger WHERE job_id LIKE $1", prefix + "%"
        )
        still_open = await connection.fetchval(
            "SELECT count(*) FROM quota.open_intervals WHERE job_id LIKE $1", prefix + "%"
        )
    finally:
        await connection.close()
    return {(row["job_id"], row["generation"]): row["gpu_seconds"] for row in rows}, int(still_open)
