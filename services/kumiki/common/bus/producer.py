"""Publishing events: acks=all, idempotence where the broker supports it, CloudEvents and traceparent headers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner, murmur2
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from google.protobuf.message import Message
from opentelemetry import trace

from kumiki.common.bus.access import UndeclaredAccess
from kumiki.common.bus.admin import start_client
from kumiki.common.bus.cloudevents import CloudEventAttributes, format_time
from kumiki.common.bus.metrics import PUBLISH_ROUND_RECORDS, PUBLISHED
from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings
from kumiki.common.metrics import labelled
from kumiki.common.tracing import inject_headers, recording, send_attributes, send_span_name

tracer = trace.get_tracer("kumiki.bus")
# The client's default request limit, stated so a record over it is refused before it joins a batch (a
# rejected batch fails every record in it, so an oversized one must not take its neighbours down with it).
MAX_REQUEST_BYTES = 1024 * 1024


class KeyHashCache:
    """Kafka's default partitioner (murmur2 of the key), remembering recent keys: the events of one job
    share a key and are usually published together, and murmur2 in pure Python costs more than the rest."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self.hashes: dict[bytes, int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return int(DefaultPartitioner()(key, all_partitions, available))
        hashed = self.hashes.get(key)
        if hashed is None:
            if len(self.hashes) >= self.size:
                self.hashes.clear()
            hashed = self.hashes[key] = murmur2(key) & 0x7FFFFFFF
        return all_partitions[hashed % len(all_partitions)]


@dataclass(frozen=True, slots=True)
class OutgoingEvent:
    """One event to publish: its topic, key (the partition), payload and optional CloudEvents id."""

    spec: TopicSpec
    key: str
    payload: Message
    event_id: str | None = None


class RecordBatches:
    """Records of one burst gathered into one record batch per partition of an aiokafka producer and handed
    over with `send_batch`: the client's per-record path (a future and a sender wake-up per record) costs more
    than encoding the record. A full batch goes at once and the record starts the next one; batches of one
    partition are queued in order."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self.open: dict[tuple[str, int], Any] = {}
        self.sent: dict[Any, asyncio.Future[Any]] = {}  # batch -> the client's future for it

    async def add(
        self, topic: str, partition: int, key: bytes | None, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Any:
        """Append a record; returns the batch that holds it (look up its future in `sent` after `send`)."""
        batch = self.open.get((topic, partition))
        if batch is None or batch.append(timestamp=None, key=key, value=value, headers=list(headers)) is None:
            if batch is not None:  # full: it goes now
                await self._submit(topic, partition)
            batch = self.open[(topic, partition)] = self.producer.create_batch()
            batch.append(timestamp=None, key=key, value=value, headers=list(headers))  # a first record always fits
        return batch

    async def send(self) -> list[asyncio.Future[Any]]:
        """Hand every open batch to the client; returns the futures of all batches of the burst."""
        for topic, partition in list(self.open):
            await self._submit(topic, partition)
        return list(self.sent.values())

    async def _submit(self, topic: str, partition: int) -> None:
        batch = self.open.pop((topic, partition))
        self.sent[batch] = await self.producer.send_batch(batch, topic, partition=partition)


@dataclass(slots=True)
class _Waiting:
    """Records of one publish call, encoded and queued for the next round, and the future its caller awaits."""

    records: list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]
    done: asyncio.Future[None]


class EventProducer:
    """One per process. `publish` returns once the broker has the record on all in-sync replicas.

    Group commit: calls made while a round of records is on its way to the broker wait for it and go out
    together in the next round. A round is handed to the client in one burst, so its sender wakes once per
    round instead of once per record: a process answering many small requests (a bind is two events) spends
    its CPU on the requests rather than on the client's bookkeeping, and waits at most one extra round trip.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        source: str,
        writes: Collection[TopicSpec] | None = None,
        *,
        headers: Callable[[bytes], list[tuple[str, bytes]]] | None = None,
    ) -> None:
        self.settings = settings
        self.source = source
        # more headers on every record, asked for each record with its bytes: the node agent's token (which the
        # kubelet rotates) or its signature of the record
        self._headers = headers
        # the topics its process declares writing (kumiki.common.bus.access); None: any. A publish elsewhere is
        # refused here, before a secured broker would refuse it, so an undeclared write fails every test.
        self._writes = None if writes is None else frozenset(spec.full_name(settings.topic_prefix) for spec in writes)
        self._partitioner = KeyHashCache()
        self._producer = AIOKafkaProducer(
            **settings.client_options(),
            acks="all",
            enable_idempotence=settings.idempotent_producer,
            linger_ms=settings.linger_ms,
            max_batch_size=256 * 1024,
            max_request_size=MAX_REQUEST_BYTES,
            partitioner=self._partitioner,
        )
        self._queued: list[_Waiting] = []
        self._rounds: asyncio.Task[None] | None = None
        self.rounds_sent = 0  # publish calls per round = how much group commit saves

    async def start(self) -> None:
        await start_client(self._producer, self.settings)

    async def stop(self) -> None:
        if self._rounds is not None:
            await asyncio.wait([self._rounds])  # what callers already handed over still goes out
        await self._producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _record(
        self, record: OutgoingEvent, time: datetime, stamp: bytes, trace_headers: list[tuple[str, bytes]]
    ) -> tuple[bytes, list[tuple[str, bytes]], CloudEventAttributes]:
        spec, payload = record.spec, record.payload
        if spec.payload is not None and not isinstance(payload, spec.payload):
            raise TypeError(f"topic {spec.name} carries {spec.payload.__name__}, not {type(payload).__name__}")
        attributes = CloudEventAttributes.new(spec.ce_type, self.source, record.event_id, time)
        value = payload.SerializeToString()
        headers = attributes.headers(stamp) + trace_headers
        if self._headers is not None:
            headers += self._headers(value)
        return value, headers, attributes

    async def publish(
        self,
        spec: TopicSpec,
        key: str,
        payload: Message,
        *,
        event_id: str | None = None,
        time: datetime | None = None,
    ) -> CloudEventAttributes:
        """Publish and wait for the broker's acknowledgement; the event id is the CloudEvents ce_id."""
        (attributes,) = await self.publish_records([OutgoingEvent(spec, key, payload, event_id)], time=time)
        return attributes

    async def publish_many(
        self, spec: TopicSpec, items: Sequence[tuple[str, Message]] | Sequence[tuple[str, Message, str]]
    ) -> int:
        """Publish a batch (key, payload[, event id]) and wait until every record is acknowledged."""
        records = [OutgoingEvent(spec, item[0], item[1], item[2] if len(item) > 2 else None) for item in items]
        await self.publish_records(records)
        return len(records)

    async def publish_records(
        self, records: Sequence[OutgoingEvent], *, time: datetime | None = None
    ) -> list[CloudEventAttributes]:
        """Publish events, to one topic or several, under one PRODUCER span, and wait for every acknowledgement.

        One span and one trace context for the lot is what makes a bind's two events cheap: the records
        share their timestamp and traceparent, and the broker acknowledges them in the same round trip.
        """
        if not records:
            return []
        if not recording():
            return await self._send_all(records, time)
        topics = [record.spec.full_name(self.settings.topic_prefix) for record in records]
        with tracer.start_as_current_span(
            send_span_name(topics), kind=trace.SpanKind.PRODUCER, attributes=send_attributes(topics, len(records))
        ) as span:
            sent = await self._send_all(records, time)
            span.set_attribute("messaging.message.id", ", ".join(attributes.id for attributes in sent))
        return sent

    async def _send_all(self, records: Sequence[OutgoingEvent], time: datetime | None) -> list[CloudEventAttributes]:
        moment = time or datetime.now(UTC)
        stamp = format_time(moment)
        trace_headers = inject_headers()
        encoded = []
        sent = []
        for record in records:
            value, headers, attributes = self._record(record, moment, stamp, trace_headers)
            topic, key = record.spec.full_name(self.settings.topic_prefix), record.key.encode()
            self._check_declared(topic)
            size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
            if size > MAX_REQUEST_BYTES:  # refused here, before any of the call's records is queued
                raise MessageSizeTooLargeError(f"{topic}: a record of {size} bytes, over {MAX_REQUEST_BYTES}")
            encoded.append((topic, key, value, headers))
            sent.append(attributes)
        waiting = _Waiting(encoded, asyncio.get_running_loop().create_future())
        self._queued.append(waiting)
        if self._rounds is None:
            self._rounds = asyncio.create_task(self._send_rounds(), name="kumiki-producer-rounds")
        await asyncio.shield(waiting.done)  # a cancelled caller's records still go out with their round
        for record in records:
            labelled(PUBLISHED, record.spec.name).inc()
        return sent

    async def _send_rounds(self) -> None:
        """Send what is queued as one round and wait for the broker's answer; repeat until nothing is queued."""
        round_: list[_Waiting] = []
        try:
            while self._queued:
                round_, self._queued = self._queued, []
                await self._send_round(round_)
        finally:
            self._rounds = None
            for waiting in [*round_, *self._queued]:  # cancelled at shutdown: every caller gets an answer
                if not waiting.done.done():
                    waiting.done.set_exception(ConnectionError("producer stopped before the record was acknowledged"))
            self._queued = []

    async def _send_round(self, round_: list[_Waiting]) -> None:
        """One record batch per partition; a caller hears success when every batch holding one of its records
        is acknowledged."""
        partitions: dict[str, list[int]] = {}
        batches = RecordBatches(self._producer)
        needs: list[tuple[_Waiting, list[Any]]] = []
        for waiting in round_:
            try:  # the only refusal left: no metadata for a topic (unknown, or the broker is away)
                for topic, *_ in waiting.records:
                    if topic not in partitions:
                        partitions[topic] = sorted(await self._producer.partitions_for(topic))
            except Exception as error:
                waiting.done.set_exception(error)
                continue
            holding = []
            for topic, key, value, headers in waiting.records:
                partition = self._partitioner(key, partitions[topic], partitions[topic])
                holding.append(await batches.add(topic, partition, key, value, headers))
            needs.append((waiting, holding))
        futures = await batches.send()
        self.rounds_sent += 1
        PUBLISH_ROUND_RECORDS.observe(sum(len(waiting.records) for waiting, _ in needs))
        if futures:
            await asyncio.wait(futures)
        for waiting, holding in needs:
            failed = next((problem for batch in holding if (problem := batches.sent[batch].exception())), None)
            if failed is None:
                waiting.done.set_result(None)
            else:
                waiting.done.set_exception(failed)

    def _check_declared(self, topic: str) -> None:
        if self._writes is not None and topic not in self._writes:
            raise UndeclaredAccess(
                f"{self.source}: publishing to {topic}, a topic this process does not declare writing"
                " (kumiki.common.bus.access.ACCESS)"
            )

    async def send_raw(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        """Publish bytes as they are (dead-lettering keeps the original record intact)."""
        self._check_declared(topic)
        await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))
