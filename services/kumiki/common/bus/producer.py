"""Publishing events: acks=all, idempotence where the broker supports it, CloudEvents and traceparent headers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner, murmur2
from google.protobuf.message import Message
from opentelemetry import trace

from kumiki.common.bus.admin import start_client
from kumiki.common.bus.cloudevents import CloudEventAttributes, format_time
from kumiki.common.bus.metrics import PUBLISHED
from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings
from kumiki.common.tracing import inject_headers, recording

tracer = trace.get_tracer("kumiki.bus")


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


class EventProducer:
    """One per process. `publish` returns once the broker has the record on all in-sync replicas."""

    def __init__(self, settings: KafkaSettings, source: str) -> None:
        self.settings = settings
        self.source = source
        self._producer = AIOKafkaProducer(
            **settings.client_options(),
            acks="all",
            enable_idempotence=settings.idempotent_producer,
            linger_ms=settings.linger_ms,
            max_batch_size=256 * 1024,
            partitioner=KeyHashCache(),
        )

    async def start(self) -> None:
        await start_client(self._producer, self.settings)

    async def stop(self) -> None:
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
        return payload.SerializeToString(), attributes.headers(stamp) + trace_headers, attributes

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
        topics = {record.spec.name for record in records}
        name = f"publish {next(iter(topics))}" if len(topics) == 1 else "publish " + ", ".join(sorted(topics))
        if len(records) > 1:
            name += f" x{len(records)}"
        with tracer.start_as_current_span(name, kind=trace.SpanKind.PRODUCER) as span:
            span.set_attribute("messaging.destination.name", ", ".join(sorted(topics)))
            sent = await self._send_all(records, time)
            span.set_attribute("messaging.message.id", ", ".join(attributes.id for attributes in sent))
        return sent

    async def _send_all(self, records: Sequence[OutgoingEvent], time: datetime | None) -> list[CloudEventAttributes]:
        moment = time or datetime.now(UTC)
        stamp = format_time(moment)
        trace_headers = inject_headers()
        futures = []
        sent = []
        for record in records:
            value, headers, attributes = self._record(record, moment, stamp, trace_headers)
            topic = record.spec.full_name(self.settings.topic_prefix)
            futures.append(await self._producer.send(topic, value, key=record.key.encode(), headers=headers))
            sent.append(attributes)
        for future in futures:  # all were sent before the first wait: one round trip for the lot
            await future
        for record in records:
            PUBLISHED.labels(record.spec.name).inc()
        return sent

    async def send_raw(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        """Publish bytes as they are (dead-lettering keeps the original record intact)."""
        await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))
