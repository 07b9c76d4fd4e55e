"""The event bus: topic registry, CloudEvents codec, producer, consumer with dead-lettering."""

from kumiki.common.bus.admin import BrokerUnavailable, ensure_topics
from kumiki.common.bus.codec import Event, RejectedRecord, decode
from kumiki.common.bus.consumer import EventConsumer, EventRejected
from kumiki.common.bus.producer import EventProducer
from kumiki.common.bus.topics import ALL_TOPICS, TopicSpec

__all__ = [
    "ALL_TOPICS",
    "BrokerUnavailable",
    "Event",
    "EventConsumer",
    "EventProducer",
    "EventRejected",
    "RejectedRecord",
    "TopicSpec",
    "decode",
    "ensure_topics",
]
