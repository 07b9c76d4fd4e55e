"""Produce and consume throughput of Kumiki's bus against raw aiokafka on the same broker, same process.

    python benchmarks/bus_throughput.py [--events 20000] [--callers 64] [--bootstrap HOST:PORT]

Two ways to publish: one call for all events (a batch), and `--callers` concurrent callers each publishing one
event and waiting for its acknowledgement before the next (how a service answering requests publishes; the
bus's group commit shares rounds between them, raw aiokafka sends each with send_and_wait).

Without --bootstrap (or KUMIKI_KAFKA_BOOTSTRAP) it starts the development broker (noida-db) in a
temporary folder. The baseline is raw aiokafka with the same acks=all producer settings and bytes of
the same size; the ratio shows what CloudEvents headers, protobuf, tracing, validation, dedupe and
commit-after-handle cost.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

from _support import broker, publish_from_callers, raw_consumer
from aiokafka import AIOKafkaProducer
from rich.console import Console
from rich.table import Table

from kumiki.common.bus import Event, EventConsumer, EventProducer, ensure_topics
from kumiki.common.bus.topics import DEAD_LETTER, JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2


def payloads(count: int) -> list[tuple[str, events_pb2.JobLifecycle]]:
    return [
        (
            f"job-{i % 512}",
            events_pb2.JobLifecycle(
                job=common_pb2.JobRef(job_id=f"job-{i % 512}", generation=1),
                state=events_pb2.JOB_STATE_SUBMITTED,
                queue="team-a",
                gpus=8,
            ),
        )
        for i in range(count)
    ]


async def raw_produce(settings: KafkaSettings, topic: str, values: list[tuple[str, bytes]]) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=2,
        max_batch_size=256 * 1024,
    )
    await producer.start()
    started = time.perf_counter()
    futures = [await producer.send(topic, value, key=key.encode()) for key, value in values]
    await asyncio.gather(*futures)
    elapsed = time.perf_counter() - started
    await producer.stop()
    return elapsed


async def raw_produce_calls(
    settings: KafkaSettings, topic: str, values: list[tuple[str, bytes]], callers: int
) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap, acks="all", enable_idempotence=True, max_batch_size=256 * 1024
    )
    await producer.start()
    queue = list(values)

    async def caller() -> None:
        while queue:
            key, value = queue.pop()
            await producer.send_and_wait(topic, value, key=key.encode())

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    elapsed = time.perf_counter() - started
    await producer.stop()
    return elapsed


async def raw_consume(settings: KafkaSettings, topic: str, count: int) -> float:
    consumer = raw_consumer(settings.bootstrap, topic)
    await consumer.start()
    seen = 0
    started = time.perf_counter()
    while seen < count:
        batches = await consumer.getmany(timeout_ms=500, max_records=500)
        for partition, records in batches.items():
            seen += len(records)
            await consumer.commit({partition: records[-1].offset + 1})
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return elapsed


async def bus_consume(settings: KafkaSettings, count: int, producer: EventProducer) -> float:
    handled = 0
    done = asyncio.Event()

    async def handler(event: Event, connection: object) -> None:
        nonlocal handled
        handled += 1
        if handled >= count:
            done.set()

    consumer = EventConsumer(settings, [JOB_LIFECYCLE], f"bus-{uuid.uuid4().hex[:6]}", handler, producer)
    await consumer.start()
    started = time.perf_counter()
    task = asyncio.create_task(consumer.run())
    await done.wait()
    elapsed = time.perf_counter() - started
    consumer.request_stop()
    await task
    await consumer.stop()
    return elapsed


async def measure(events: int, callers: int, bootstrap: str) -> dict[str, float]:
    base = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-{uuid.uuid4().hex[:6]}.")
    raw = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-raw-{uuid.uuid4().hex[:6]}.")
    await ensure_topics(base, [JOB_LIFECYCLE, DEAD_LETTER])
    await ensure_topics(raw, [JOB_LIFECYCLE])
    items = payloads(events)
    raw_values = [(key, message.SerializeToString()) for key, message in items]
    raw_topic = JOB_LIFECYCLE.full_name(raw.topic_prefix)
    results = {"produce (raw aiokafka)": await raw_produce(raw, raw_topic, raw_values)}
    calls = f"produce, {callers} callers"
    results[f"{calls} (raw aiokafka)"] = await raw_produce_calls(raw, raw_topic, raw_values, callers)
    async with EventProducer(base, "//kumiki/bench") as producer:
        started = time.perf_counter()
        await producer.publish_many(JOB_LIFECYCLE, items)
        results["produce (kumiki bus)"] = time.perf_counter() - started
        results[f"{calls} (kumiki bus)"] = await publish_from_callers(producer, JOB_LIFECYCLE, items, callers)
        results["consume (raw aiokafka)"] = await raw_consume(raw, raw_topic, 2 * events)
        results["consume (kumiki bus)"] = await bus_consume(base, 2 * events, producer)
    return results


def main(events: int, callers: int, bootstrap: str | None) -> None:
    with broker(bootstrap) as address:
        results = asyncio.run(measure(events, callers, address))
    table = Table(title=f"bus throughput, {events:,} events, broker {address}")
    for column in ("path", "seconds", "events/s", "vs raw"):
        table.add_column(column)
    for name, seconds in results.items():
        baseline = results[name.split(" (")[0] + " (raw aiokafka)"]
        count = 2 * events if name.startswith("consume") else events  # both produce runs are read back
        table.add_row(name, f"{seconds:.2f}", f"{count / seconds:,.0f}", f"{baseline / seconds:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=20_000, help="events per measurement (>= 100)")
    parser.add_argument("--callers", type=int, default=64, help="concurrent one-event callers (>= 1)")
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"), help="broker host:port")
    arguments = parser.parse_args()
    if arguments.events < 100:
        parser.error(f"--events: must be >= 100, got {arguments.events}")
    if arguments.callers < 1:
        parser.error(f"--callers: must be >= 1, got {arguments.callers}")
    main(arguments.events, arguments.callers, arguments.bootstrap)
