"""The node-records table's value codec: faust's JSON codec, the same bytes, without a Python call per GPU.

faust encodes with orjson, which renders the `NodeRecord` dataclass in C but not a NamedTuple: it called
faust's `on_default` (a chain of isinstance checks against abstract classes) for every `GpuLive`, about 3 µs
each, 24 µs for an 8-GPU node, on every record write. Here a `GpuLive` is handed to orjson as the plain
tuple it is. Reading is faust's JSON reading, so changelogs written either way restore alike.
"""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs
from faust.utils import json as faust_json

from kumiki.telemetry.core import GpuLive

try:
    import orjson
except ImportError:  # pragma: no cover - faust then uses the json module and NodeRecord.__json__
    orjson = None  # type: ignore[assignment]

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z if orjson is not None else 0  # faust's own


def _default(value: Any) -> Any:
    if type(value) is GpuLive:
        return value[:]  # a slice of a NamedTuple is a tuple, which orjson writes as an array
    return faust_json.on_default(value)


class NodeRecordJson(codecs.json):
    """faust's `json` codec, with a `GpuLive` written as an array without a Python call."""

    def _dumps(self, value: Any) -> bytes:
        if orjson is None:
            return super()._dumps(value)
        return orjson.dumps(value, default=_default, option=_OPTIONS)
