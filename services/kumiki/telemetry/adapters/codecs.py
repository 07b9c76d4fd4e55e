"""The node-records table's value codec: faust's JSON codec, the same bytes, at a fraction of the cost.

A node record is written to the changelog at every chunk. faust encodes with orjson, which renders the
`NodeRecord` dataclass in C but not a NamedTuple: it called faust's `on_default` (a chain of isinstance
checks against abstract classes) for every `GpuLive`, about 3 µs each. Here a `GpuLive` is handed to orjson
as the plain tuple it is, and the inventory, which rarely changes and is most of the record's bytes, is
rendered once per `Inventory` object and reused as an `orjson.Fragment`. Reading is faust's JSON reading,
so changelogs written either way restore alike; a test holds the bytes equal to faust's.
"""

from __future__ import annotations

from typing import Any

from faust.serializers import codecs
from faust.utils import json as faust_json

from kumiki.telemetry.core import GpuLive, Inventory, NodeRecord

try:
    import orjson
except ImportError:  # pragma: no cover - faust then uses the json module and NodeRecord.__json__
    orjson = None  # type: ignore[assignment]

_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_UTC_Z if orjson is not None else 0  # faust's own


def _default(value: Any) -> Any:
    if type(value) is GpuLive:
        return value[:]  # a slice of a NamedTuple is a tuple, which orjson writes as an array
    return faust_json.on_default(value)


_REMEMBERED = 65536  # rendered inventories kept (one per node); cleared when full


class NodeRecordJson(codecs.json):
    """faust's `json` codec, with a `GpuLive` written as an array without a Python call."""

    def __init__(self) -> None:
        super().__init__()
        self._inventories: dict[int, tuple[Inventory, Any]] = {}  # id → (the object, its JSON)

    def _dumps(self, value: Any) -> bytes:
        if orjson is None:
            return super()._dumps(value)
        if type(value) is NodeRecord:
            value = {  # NodeRecord's fields in their order, as orjson renders the dataclass
                "node": value.node,
                "inventory": self._inventory(value.inventory),
                "gpus": value.gpus,
                "holdings": value.holdings,
                "last_seen": value.last_seen,
                "stale": value.stale,
                "version": value.version,
                "published_digest": value.published_digest,
                "published_at": value.published_at,
            }
        return orjson.dumps(value, default=_default, option=_OPTIONS)

    def _inventory(self, inventory: Inventory | None) -> Any:
        if inventory is None:
            return None
        cached = self._inventories.get(id(inventory))
        if cached is not None and cached[0] is inventory:
            return cached[1]
        if len(self._inventories) >= _REMEMBERED:
            self._inventories.clear()
        fragment = orjson.Fragment(orjson.dumps(inventory, default=_default, option=_OPTIONS))
        self._inventories[id(inventory)] = (inventory, fragment)
        return fragment
