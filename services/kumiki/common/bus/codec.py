"""Turning Kafka records into validated events and back; every failure is a `RejectedRecord` with a reason."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError, Message

from kumiki.common.bus.cloudevents import CloudEventAttributes, CloudEventError, parse_headers
from kumiki.common.bus.topics import TopicSpec


class RejectedRecord(ValueError):
    """A record that can never be handled (undecodable, invalid): it goes to the dead-letter topic."""


@dataclass(frozen=True, slots=True)
class Event:
    """A decoded record: the CloudEvent attributes, the protobuf payload and where it came from."""

    topic: TopicSpec
    key: str
    payload: Message
    attributes: CloudEventAttributes
    headers: Sequence[tuple[str, bytes]] = field(default=(), repr=False)
    partition: int = -1
    offset: int = -1


def decode(spec: TopicSpec, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> Event:
    """Decode and validate one record of `spec`; raise RejectedRecord naming what is wrong."""
    if spec.payload is None:
        raise RejectedRecord(f"topic {spec.name}: has no payload type to decode")
    try:
        attributes = parse_headers(headers)
    except CloudEventError as error:
        raise RejectedRecord(str(error)) from None
    if attributes.type != spec.ce_type:
        raise RejectedRecord(f"header ce_type: expected {spec.ce_type}, got {attributes.type}")
    if value is None:
        raise RejectedRecord("value: empty record (tombstones are not events)")
    payload = spec.payload()
    try:
        payload.ParseFromString(value)
    except DecodeError as error:
        raise RejectedRecord(f"value: not a valid {spec.payload.DESCRIPTOR.full_name}: {error}") from None
    problems = spec.validate(payload)
    if problems:
        raise RejectedRecord("; ".join(problems))
    try:
        text_key = key.decode() if key is not None else ""
    except UnicodeDecodeError:
        raise RejectedRecord("key: not UTF-8") from None
    return Event(topic=spec, key=text_key, payload=payload, attributes=attributes, headers=headers)
