"""Window aggregates: the sums a window table holds per key (GPU, node, job, queue). They merge, so a window
is filled chunk by chunk and a changelog restores it exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kumiki.telemetry.core.chunks import GpuChunk, NodeChunk
from kumiki.telemetry.core.json_types import Json


@dataclass(frozen=True, slots=True)
class WindowAggregate:
    """What a window table holds per key: sums that merge (so windows can be filled chunk by chunk)."""

    samples: int = 0
    util_n: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    idle_gpu_s: float = 0.0

    @property
    def mean_util_pct(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None

    def merge(self, other: WindowAggregate) -> WindowAggregate:
        return WindowAggregate(
            self.samples + other.samples,
            self.util_n + other.util_n,
            self.util_sum + other.util_sum,
            max(self.util_max, other.util_max),
            self.allocated_gpu_s + other.allocated_gpu_s,
            self.used_gpu_s + other.used_gpu_s,
            self.idle_gpu_s + other.idle_gpu_s,
        )

    def to_json(self) -> Json:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Sequence[float] | None) -> WindowAggregate:
        """Accepts the object form and the array form that node windows store."""
        if not data:
            return cls()
        if isinstance(data, Mapping):
            return cls(**data)
        return cls(int(data[0]), int(data[1]), *data[2:])


def merge_json(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Json:
    """The faust window op: JSON in, JSON out."""
    return WindowAggregate.from_json(old).merge(WindowAggregate.from_json(new)).to_json()


def gpu_aggregate(gpu: GpuChunk) -> WindowAggregate:
    return WindowAggregate(gpu.samples, gpu.util_n, gpu.util_sum, gpu.util_max)


Sums = list[float]  # the WindowAggregate fields in order: node windows store arrays (merged per chunk)


def _sums(value: Mapping[str, Any] | Sequence[float] | None) -> Sums:
    if not value:
        return [0, 0, 0.0, 0.0, 0.0, 0.0, 0.0]
    if type(value) is list:  # the usual case, first: the Mapping check below is an abstract-class one
        return value
    if isinstance(value, Mapping):  # a window written before node windows stored arrays
        return [value[name] for name in WindowAggregate.__slots__]
    return list(value)


def _merge_sums(a: Sums, b: Sums) -> Sums:
    return [a[0] + b[0], a[1] + b[1], a[2] + b[2], max(a[3], b[3]), a[4] + b[4], a[5] + b[5], a[6] + b[6]]


def node_window(chunk: NodeChunk) -> Json:
    """One window value per node: the node's sums and each GPU's, so a chunk is one table write."""
    gpus: dict[str, Sums] = {}
    total: Sums = _sums(None)
    for key, gpu in chunk.gpus.items():
        if gpu.mig is None:
            gpus[key] = sums = [gpu.samples, gpu.util_n, gpu.util_sum, gpu.util_max, 0.0, 0.0, 0.0]
            total = _merge_sums(total, sums)
    return {"node": total, "gpus": gpus}


def merge_node_window(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Json:
    """The faust window op for node windows (an empty `old` is a window not seen yet)."""
    if not old:
        return dict(new)
    old_gpus: Mapping[str, Any] = old.get("gpus", {})
    gpus = dict(old_gpus)
    for key, value in new["gpus"].items():
        previous = old_gpus.get(key)
        gpus[key] = _merge_sums(_sums(previous), value) if previous else value
    return {"node": _merge_sums(_sums(old.get("node")), new["node"]), "gpus": gpus}


def node_aggregate(chunk: NodeChunk) -> WindowAggregate:
    total = WindowAggregate()
    for gpu in chunk.gpus.values():
        if gpu.mig is None:
            total = total.merge(gpu_aggregate(gpu))
    return total
