"""CloudEvents 1.0 in Kafka binary mode: the attributes travel as `ce_*` headers, the payload as the value."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

SPEC_VERSION = "1.0"
CONTENT_TYPE = "application/protobuf"
REQUIRED = ("ce_specversion", "ce_type", "ce_source", "ce_id", "ce_time")


class CloudEventError(ValueError):
    """Headers that do not make a CloudEvent; the message names the header."""


@dataclass(frozen=True, slots=True)
class CloudEventAttributes:
    id: str
    type: str
    source: str
    time: datetime
    specversion: str = SPEC_VERSION

    @classmethod
    def new(cls, type_: str, source: str, id_: str | None = None, time: datetime | None = None) -> CloudEventAttributes:
        return cls(id=id_ or str(uuid.uuid4()), type=type_, source=source, time=time or datetime.now(UTC))

    def headers(self, stamp: bytes | None = None) -> list[tuple[str, bytes]]:
        """`stamp`: ce_time already formatted (`format_time(self.time)`), for events that share one."""
        return [
            ("ce_specversion", self.specversion.encode()),
            ("ce_type", self.type.encode()),
            ("ce_source", self.source.encode()),
            ("ce_id", self.id.encode()),
            ("ce_time", stamp or format_time(self.time)),
            ("content-type", CONTENT_TYPE.encode()),
        ]


def format_time(moment: datetime) -> bytes:
    """RFC 3339 in UTC with microseconds and a Z, as ce_time."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z").encode()


def parse_headers(headers: Iterable[tuple[str, bytes]]) -> CloudEventAttributes:
    found: dict[str, str] = {}
    for key, value in headers:
        if key in REQUIRED:
            try:
                found[key] = value.decode()
            except (UnicodeDecodeError, AttributeError):
                raise CloudEventError(f"header {key}: not UTF-8") from None
    for key in REQUIRED:
        if not found.get(key):
            raise CloudEventError(f"header {key}: missing")
    if found["ce_specversion"] != SPEC_VERSION:
        raise CloudEventError(f"header ce_specversion: expected {SPEC_VERSION}, got {found['ce_specversion']!r}")
    try:
        time = datetime.fromisoformat(found["ce_time"].replace("Z", "+00:00"))
    except ValueError:
        raise CloudEventError(f"header ce_time: not RFC 3339, got {found['ce_time']!r}") from None
    return CloudEventAttributes(
        id=found["ce_id"],
        type=found["ce_type"],
        source=found["ce_source"],
        time=time,
        specversion=found["ce_specversion"],
    )
