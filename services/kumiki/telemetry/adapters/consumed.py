"""What stage 1 reads, whichever client read it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Consumed(Protocol):
    """A consumed record: aiokafka's ConsumerRecord as it is (no copy per sample), or a `Record`."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes]]: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record, whichever client read it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]

    @classmethod
    def of_faust(cls, event: Any) -> Record:
        message = event.message
        return cls(
            message.topic, message.partition, message.offset, message.key, message.value, _header_list(message.headers)
        )


def _header_list(headers: Any) -> list[tuple[str, bytes]]:
    """faust hands headers over as a list of pairs or a mapping, depending on the path a record took."""
    if not headers:
        return []
    items = headers.items() if hasattr(headers, "items") else headers
    return [(str(key), bytes(value) if value is not None else b"") for key, value in items]
