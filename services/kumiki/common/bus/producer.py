"""Publishing events: acks=all, idempotence where the broker supports it, CloudEvents and traceparent headers."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from aiokafka import AIOKafkaProducer
from google.protobuf.message import Message
from opentelemetry import trace

from kumiki.common.bus.admin import start_client
from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.bus.metrics import PUBLISHED
from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings
from kumiki.common.tracing import inject_headers

tracer = trace.get_tracer("kumiki.bus")


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
        self, spec: TopicSpec, payload: Message, event_id: str | None, time: datetime | None
    ) -> tuple[bytes, list[tuple[str, bytes]], CloudEventAttributes]:
        if spec.payload is not None and not isinstance(payload, spec.payload):
            raise TypeError(f"topic {spec.name} carries {spec.payload.__name__}, not {type(payload).__name__}")
        attributes = CloudEventAttributes.new(spec.ce_type, self.source, event_id, time)
        return payload.SerializeToString(), attributes.headers() + inject_headers(), attributes

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
        topic = spec.full_name(self.settings.topic_prefix)
        with tracer.start_as_current_span(f"publish {spec.name}", kind=trace.SpanKind.PRODUCER) as span:
            span.set_attribute("messaging.destination.name", topic)
            span.set_attribute("messaging.message.id", event_id or "")
            value, headers, attributes = self._record(spec, payload, event_id, time)
            span.set_attribute("messaging.message.id", attributes.id)
            await self._producer.send_and_wait(topic, value, key=key.encode(), headers=headers)
        PUBLISHED.labels(spec.name).inc()
        return attributes

    async def publish_many(
        self, spec: TopicSpec, items: Sequence[tuple[str, Message]] | Sequence[tuple[str, Message, str]]
    ) -> int:
        """Publish a batch (key, payload[, event id]) and wait until every record is acknowledged."""
        topic = spec.full_name(self.settings.topic_prefix)
        futures = []
        with tracer.start_as_current_span(f"publish {spec.name} x{len(items)}", kind=trace.SpanKind.PRODUCER):
            for item in items:
                key, payload = item[0], item[1]
                event_id = item[2] if len(item) > 2 else None
                value, headers, _ = self._record(spec, payload, event_id, None)
                futures.append(await self._producer.send(topic, value, key=key.encode(), headers=headers))
            await asyncio.gather(*futures)
        PUBLISHED.labels(spec.name).inc(len(items))
        return len(items)

    async def send_raw(
        self, topic: str, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
    ) -> None:
        """Publish bytes as they are (dead-lettering keeps the original record intact)."""
        await self._producer.send_and_wait(topic, value, key=key, headers=list(headers))
