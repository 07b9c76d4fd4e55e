"""The bus against real brokers (Apache Kafka and the development broker): round trip with CloudEvents
and trace context, and dead-lettering that never stops the consumer."""

from __future__ import annotations

import asyncio
import hashlib

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kumiki.common.bus import Event, EventConsumer, EventProducer, EventRejected, ensure_topics
from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.bus.consumer import dead_letter_headers
from kumiki.common.bus.topics import DEAD_LETTER, JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.tracing import configure_tracing
from tests.conftest import read_records, wait_until

EXPORTER = InMemorySpanExporter()
configure_tracing("test", None, EXPORTER)


def lifecycle(job_id: str, queue: str = "team-a") -> events_pb2.JobLifecycle:
    return events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job_id, generation=1), state=events_pb2.JOB_STATE_SUBMITTED, queue=queue
    )


async def read_dead_letters(settings: KafkaSettings, count: int) -> list:  # type: ignore[type-arg]
    return await read_records(settings, DEAD_LETTER.full_name(settings.topic_prefix), count)


async def test_topics_are_created_once(kafka_settings: KafkaSettings) -> None:
    created = await ensure_topics(kafka_settings, [JOB_LIFECYCLE, DEAD_LETTER])
    assert sorted(created) == sorted(
        spec.full_name(kafka_settings.topic_prefix) for spec in (JOB_LIFECYCLE, DEAD_LETTER)
    )
    assert await ensure_topics(kafka_settings, [JOB_LIFECYCLE, DEAD_LETTER]) == []


async def test_round_trip_carries_cloudevents_and_trace(kafka_settings: KafkaSettings) -> None:
    await ensure_topics(kafka_settings, [JOB_LIFECYCLE, DEAD_LETTER])
    received: list[tuple[Event, int]] = []

    async def handler(event: Event, connection: object) -> None:
        received.append((event, trace.get_current_span().get_span_context().trace_id))

    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("decide") as span:
            sent = await producer.publish(JOB_LIFECYCLE, "job-1", lifecycle("job-1"), event_id="evt-1")
            trace_id = span.get_span_context().trace_id
        consumer = EventConsumer(kafka_settings, [JOB_LIFECYCLE], "g-roundtrip", handler, producer)
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        try:
            await wait_until(lambda: received, what="the event")
        finally:
            consumer.request_stop()
            await task
            await consumer.stop()
    event, consumer_trace = received[0]
    assert event.key == "job-1"
    assert event.attributes.id == "evt-1" == sent.id
    assert event.attributes.type == "dev.kumiki.v1.JobLifecycle"
    assert event.attributes.source == "//kumiki/test"
    assert event.payload == lifecycle("job-1")
    assert consumer_trace == trace_id, "the consumer span must continue the producer's trace"


async def test_bad_records_go_to_dead_letter_and_consumer_carries_on(kafka_settings: KafkaSettings) -> None:
    await ensure_topics(kafka_settings, [JOB_LIFECYCLE, DEAD_LETTER])
    topic = JOB_LIFECYCLE.full_name(kafka_settings.topic_prefix)
    handled: list[str] = []

    async def handler(event: Event, connection: object) -> None:
        if event.payload.queue == "unknown-queue":
            raise EventRejected("queue: unknown queue 'unknown-queue'")
        handled.append(event.key)

    headers = CloudEventAttributes.new(JOB_LIFECYCLE.ce_type, "//test").headers()
    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        # everything on one key = one partition, so the order below is the order consumed
        await producer.publish(JOB_LIFECYCLE, "k", lifecycle("first"))
        await producer.send_raw(topic, b"k", b"\x08\x96\x01\xff\xff", headers)  # not protobuf
        await producer.send_raw(topic, b"k", lifecycle("x").SerializeToString(), [])  # no CloudEvents headers
        bad = events_pb2.JobLifecycle(job=common_pb2.JobRef(job_id="no-state", generation=1))
        await producer.send_raw(topic, b"k", bad.SerializeToString(), headers)  # fails validation
        await producer.publish(JOB_LIFECYCLE, "k", lifecycle("rejected", queue="unknown-queue"))
        await producer.publish(JOB_LIFECYCLE, "k", lifecycle("last"))
        consumer = EventConsumer(kafka_settings, [JOB_LIFECYCLE], "g-dlq", handler, producer)
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        try:
            await wait_until(lambda: len(handled) == 2, what="both valid events")
        finally:
            consumer.request_stop()
            await task
            await consumer.stop()
    assert consumer.dead_lettered == 4
    records = await read_dead_letters(kafka_settings, 4)
    reasons = [dict(record.headers)["kumiki_dlq_reason"].decode() for record in records]
    assert "not a valid kumiki.v1.JobLifecycle" in reasons[0]
    assert "header ce_specversion: missing" in reasons[1]
    assert "state: required" in reasons[2]
    assert reasons[3] == "rejected: queue: unknown queue 'unknown-queue'"
    assert {dict(record.headers)["kumiki_dlq_topic"] for record in records} == {topic.encode()}
    assert records[0].value == b"\x08\x96\x01\xff\xff", "the original bytes are kept"


async def test_duplicate_ce_id_is_applied_once(kafka_settings: KafkaSettings) -> None:
    await ensure_topics(kafka_settings, [JOB_LIFECYCLE, DEAD_LETTER])
    handled: list[str] = []

    async def handler(event: Event, connection: object) -> None:
        handled.append(event.attributes.id)

    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        for _ in range(3):  # a producer retrying the same event
            await producer.publish(JOB_LIFECYCLE, "k", lifecycle("j"), event_id="same-id")
        await producer.publish(JOB_LIFECYCLE, "k", lifecycle("j"), event_id="other-id")
        consumer = EventConsumer(kafka_settings, [JOB_LIFECYCLE], "g-dupe", handler, producer)
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        try:
            await wait_until(lambda: "other-id" in handled, what="the last event")
        finally:
            consumer.request_stop()
            await task
            await consumer.stop()
    assert handled == ["same-id", "other-id"]


def test_key_hash_cache_partitions_exactly_as_kafka_default() -> None:
    """Remembering hashes must never move a key: a job's events stay on the partition Kafka would choose."""
    from aiokafka.partitioner import DefaultPartitioner

    from kumiki.common.bus.producer import KeyHashCache

    cache = KeyHashCache(size=16)  # small, so it is cleared and refilled many times
    for index in range(3000):
        key = f"job-{(index * 7919) % 97}".encode()
        partitions = list(range(1 + index % 12))
        assert cache(key, partitions, partitions) == DefaultPartitioner()(key, partitions, partitions)
    assert 0 < len(cache.hashes) <= 16


async def test_concurrent_publishes_share_rounds_and_keep_each_keys_order(kafka_settings: KafkaSettings) -> None:
    """Group commit: 40 callers at once, each publishing its key's events one after another. Every event
    arrives once, in its key's order, and calls made while a round was in flight went out together."""
    await ensure_topics(kafka_settings, [JOB_LIFECYCLE])
    callers, events_each = 40, 15

    async def caller(producer: EventProducer, index: int) -> None:
        for generation in range(1, events_each + 1):
            change = lifecycle(f"job-{index}")
            change.job.generation = generation
            await producer.publish(JOB_LIFECYCLE, f"job-{index}", change, event_id=f"job-{index}/{generation}")

    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        await asyncio.gather(*(caller(producer, index) for index in range(callers)))
        rounds = producer.rounds_sent
    records = await read_records(
        kafka_settings, JOB_LIFECYCLE.full_name(kafka_settings.topic_prefix), callers * events_each
    )
    assert len(records) == callers * events_each
    by_key: dict[bytes, list[int]] = {}
    for record in sorted(records, key=lambda record: (record.partition, record.offset)):
        by_key.setdefault(record.key, []).append(events_pb2.JobLifecycle.FromString(record.value).job.generation)
    assert by_key == {f"job-{index}".encode(): list(range(1, events_each + 1)) for index in range(callers)}
    assert rounds < callers * events_each / 4, f"{rounds} rounds for {callers * events_each} calls: nothing shared"


async def test_an_oversized_record_fails_its_caller_alone(kafka_settings: KafkaSettings) -> None:
    from aiokafka.errors import MessageSizeTooLargeError

    await ensure_topics(kafka_settings, [JOB_LIFECYCLE])
    huge = lifecycle("huge")
    huge.reason = "x" * (2 * 1024 * 1024)
    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        outcomes = await asyncio.gather(
            producer.publish(JOB_LIFECYCLE, "before", lifecycle("before")),
            producer.publish(JOB_LIFECYCLE, "huge", huge),
            producer.publish(JOB_LIFECYCLE, "after", lifecycle("after")),
            return_exceptions=True,
        )
    assert isinstance(outcomes[1], MessageSizeTooLargeError)
    assert JOB_LIFECYCLE.full_name(kafka_settings.topic_prefix) in str(outcomes[1]), "the error names the topic"
    assert not isinstance(outcomes[0], BaseException) and not isinstance(outcomes[2], BaseException)
    records = await read_records(kafka_settings, JOB_LIFECYCLE.full_name(kafka_settings.topic_prefix), 2)
    assert sorted(record.key for record in records) == [b"after", b"before"]


async def test_stop_sends_what_callers_handed_over(kafka_settings: KafkaSettings) -> None:
    """Calls still waiting for their round when the service stops are sent and answered, not dropped."""
    await ensure_topics(kafka_settings, [JOB_LIFECYCLE])
    producer = EventProducer(kafka_settings, "//kumiki/test")
    await producer.start()
    calls = [
        asyncio.create_task(producer.publish(JOB_LIFECYCLE, f"k{index}", lifecycle(f"j{index}"))) for index in range(50)
    ]
    await asyncio.sleep(0)  # one turn of the loop: every call has queued its record, none is answered yet
    assert not any(call.done() for call in calls)
    await producer.stop()
    assert all(call.done() and call.exception() is None for call in calls)
    records = await read_records(kafka_settings, JOB_LIFECYCLE.full_name(kafka_settings.topic_prefix), 50)
    assert len(records) == 50


def test_a_dead_letter_keeps_the_original_headers_then_names_reason_and_origin_for_every_consumer() -> None:
    headers = dead_letter_headers([("ce_type", b"x")], "undecodable: bad", "p.gpu.samples", 3, 17, "p.telemetry")
    assert headers == [
        ("ce_type", b"x"),
        ("kumiki_dlq_reason", b"undecodable: bad"),
        ("kumiki_dlq_topic", b"p.gpu.samples"),
        ("kumiki_dlq_partition", b"3"),
        ("kumiki_dlq_offset", b"17"),
        ("kumiki_dlq_group", b"p.telemetry"),
    ]


async def test_a_producers_own_headers_are_asked_for_every_record_with_its_bytes(kafka_settings: KafkaSettings) -> None:
    """The node agent's proof rides on every record: its token (a rotated one on the next publish) or its
    signature of the record's own bytes."""
    await ensure_topics(kafka_settings, [JOB_LIFECYCLE])
    token = [b"first"]

    def headers(value: bytes) -> list[tuple[str, bytes]]:
        return [("kumiki-agent-token", token[0]), ("digest", hashlib.sha256(value).hexdigest().encode())]

    async with EventProducer(kafka_settings, "//kumiki/test", headers=headers) as p:
        await p.publish_many(JOB_LIFECYCLE, [("job-1", lifecycle("job-1")), ("job-2", lifecycle("job-2"))])
        token[0] = b"second"
        await p.publish(JOB_LIFECYCLE, "job-3", lifecycle("job-3"))
    records = await read_records(kafka_settings, JOB_LIFECYCLE.full_name(kafka_settings.topic_prefix), 3)
    carried = {record.key: dict(record.headers) for record in records}
    assert {key: headers["kumiki-agent-token"] for key, headers in carried.items()} == {
        b"job-1": b"first",
        b"job-2": b"first",
        b"job-3": b"second",
    }
    for record in records:
        assert dict(record.headers)["digest"] == hashlib.sha256(record.value).hexdigest().encode()
        assert dict(record.headers)["ce_type"] == b"dev.kumiki.v1.JobLifecycle"
