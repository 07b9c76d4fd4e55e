"""Stage 1's fast path for `kumiki.common.bus.codec.decode` on GpuSample records.

`decode` costs about 8 µs a record (headers into a dict, an RFC 3339 parse, the validator, an Event), more
than everything else stage 1 does with a sample. The agents' records all look alike: the CloudEvents
headers in the order the bus producer writes them, a tick's samples sharing one `ce_time`. `FastSamples`
checks that shape with tuple comparisons, remembers the `ce_time` and `ce_source` values it has already
parsed, and validates the payload with the validator's own bounds read from the parsed message.

It only ever accepts: `reading` returns None whenever it is not sure that `decode` would accept the record
(another header layout, a value out of bounds, an unset field whose default would not prove it, bytes that
do not parse), and the caller then runs `decode` itself, which accepts or rejects with its own reason. So
what is dead-lettered, and why, does not depend on this module; `tests/telemetry/adapters/test_samples.py`
holds every record it accepts to `decode`'s verdict and reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from google.protobuf.message import DecodeError

from kumiki.common.bus.cloudevents import REQUIRED, SPEC_VERSION
from kumiki.common.bus.topics import GPU_SAMPLES
from kumiki.common.contracts.v1 import events_pb2
from kumiki.telemetry.adapters.convert import reading_from_sample
from kumiki.telemetry.core import Reading

_SPECVERSION = ("ce_specversion", SPEC_VERSION.encode())
_TYPE = ("ce_type", GPU_SAMPLES.ce_type.encode())
_REQUIRED = frozenset(REQUIRED)
_REMEMBERED = 8192  # distinct ce_time values kept (a tick's samples share one); cleared when full


def _utf8(value: bytes) -> str | None:
    if not value:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return None


class FastSamples:
    """Decodes the common shape of GpuSample records; None means "ask `decode`"."""

    def __init__(self) -> None:
        self._times: set[bytes] = set()
        self._sources: set[bytes] = set()

    def reading(self, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> Reading | None:
        try:
            head_0, head_1, (name_2, source), (name_3, event_id), (name_4, stamp) = headers[:5]
            if (
                head_0 != _SPECVERSION
                or head_1 != _TYPE
                or name_2 != "ce_source"
                or name_3 != "ce_id"
                or name_4 != "ce_time"
            ):
                return None
            for name, _ in headers[5:]:  # content-type, traceparent, ...
                if name in _REQUIRED:  # a repeated attribute: parse_headers keeps the last one
                    return None
        except (TypeError, ValueError):
            return None
        if type(event_id) is not bytes or type(stamp) is not bytes or type(source) is not bytes:
            return None
        if not event_id or not event_id.isascii():
            return None
        if stamp not in self._times and not self._remember_time(stamp):
            return None
        if source not in self._sources and not self._remember_source(source):
            return None
        if value is None or (key is not None and (type(key) is not bytes or not key.isascii())):
            return None
        try:
            sample = events_pb2.GpuSample.FromString(value)
        except DecodeError:
            return None
        # validate_gpu_sample's bounds. An unset optional field reads as 0, which passes each of them except
        # memory used (set) against memory total (unset): that record goes to decode, which accepts it.
        if not (
            sample.node
            and sample.gpu_uuid
            and 0.0 <= sample.gpu_utilization_pct <= 100.0
            and 0.0 <= sample.memory_utilization_pct <= 100.0
            and sample.memory_used_mib <= sample.memory_total_mib
            and sample.power_w >= 0.0
        ):
            return None
        return reading_from_sample(sample)

    def _remember_time(self, stamp: bytes) -> bool:
        text = _utf8(stamp)
        if text is None:
            return False
        try:
            datetime.fromisoformat(text.replace("Z", "+00:00"))  # as parse_headers does
        except ValueError:
            return False
        if len(self._times) >= _REMEMBERED:
            self._times.clear()
        self._times.add(stamp)
        return True

    def _remember_source(self, source: bytes) -> bool:
        if _utf8(source) is None:
            return False
        if len(self._sources) >= _REMEMBERED:
            self._sources.clear()
        self._sources.add(source)
        return True
