"""Readings and the chunks they are grouped into: stage 1 turns a consumed batch of samples into one record per
(node, time bucket), so the hot path sends a record per group, not per sample."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kumiki.telemetry.core.json_types import Json


class Reading(NamedTuple):
    """One validated sample, as much of it as ingest uses (a tuple: one is built per sample)."""

    node: str
    gpu_uuid: str
    gpu_index: int
    mig_instance_id: int | None
    timestamp: float
    utilization_pct: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    ecc_uncorrected: int | None
    xid_errors: tuple[int, ...]
    model: str


# XIDs that mean the GPU needs a reset or is gone (NVIDIA's XID catalogue).
FATAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass(slots=True)
class GpuChunk:
    """The readings of one GPU (or MIG instance) inside one chunk."""

    index: int
    mig: int | None
    model: str
    samples: int = 0
    util_n: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    first_ts: float = math.inf
    last_ts: float = 0.0
    last_util: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    ecc_uncorrected: int | None = None
    xids: list[int] = field(default_factory=list)

    def add(self, reading: Reading) -> None:
        _, _, _, _, timestamp, utilization_pct, memory_used_mib, memory_total_mib, ecc_uncorrected, xids, _ = reading
        self.samples += 1
        if timestamp < self.first_ts:
            self.first_ts = timestamp
        newest = timestamp >= self.last_ts
        if utilization_pct is not None:
            self.util_n += 1
            self.util_sum += utilization_pct
            if utilization_pct > self.util_max:
                self.util_max = utilization_pct
            if newest:
                self.last_util = utilization_pct
        if newest:
            self.last_ts = timestamp
            self.memory_used_mib = memory_used_mib
            self.memory_total_mib = memory_total_mib
        if ecc_uncorrected is not None:
            self.ecc_uncorrected = max(self.ecc_uncorrected or 0, ecc_uncorrected)
        if xids:
            self.xids.extend(xids)

    def to_json(self) -> list[Any]:
        """An array in field order: the internal topic carries one per GPU per chunk, names would double it."""
        return [
            self.index,
            self.mig,
            self.model,
            self.samples,
            self.util_n,
            self.util_sum,
            self.util_max,
            self.first_ts,
            self.last_ts,
            self.last_util,
            self.memory_used_mib,
            self.memory_total_mib,
            self.ecc_uncorrected,
            self.xids,
        ]

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Sequence[Any]) -> GpuChunk:
        return cls(**data) if isinstance(data, Mapping) else cls(*data)


@dataclass(slots=True)
class NodeChunk:
    """All readings of one node within one time bucket of one consumed batch: one internal record."""

    node: str
    bucket: float
    gpus: dict[str, GpuChunk] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {
            "kind": "readings",
            "node": self.node,
            "bucket": self.bucket,
            "gpus": {key: gpu.to_json() for key, gpu in self.gpus.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeChunk:
        return cls(
            data["node"], float(data["bucket"]), {key: GpuChunk.from_json(gpu) for key, gpu in data["gpus"].items()}
        )


def gpu_key(gpu_uuid: str, mig_instance_id: int | None) -> str:
    return gpu_uuid if mig_instance_id is None else f"{gpu_uuid}/mig-{mig_instance_id}"


def summarise(readings: Iterable[Reading], bucket_s: float) -> list[NodeChunk]:
    """Group a consumed batch by (node, bucket): the hot path sends one record per group, not per sample."""
    chunks: dict[tuple[str, float], NodeChunk] = {}
    floor = math.floor
    for reading in readings:
        node, gpu_uuid, gpu_index, mig, timestamp, _, _, _, _, _, model = reading
        bucket = floor(timestamp / bucket_s) * bucket_s
        chunk = chunks.get((node, bucket))
        if chunk is None:
            chunk = chunks[(node, bucket)] = NodeChunk(node, bucket)
        key = gpu_uuid if mig is None else f"{gpu_uuid}/mig-{mig}"  # gpu_key
        gpu = chunk.gpus.get(key)
        if gpu is None:
            gpu = chunk.gpus[key] = GpuChunk(gpu_index, mig, model)
        gpu.add(reading)
    return list(chunks.values())
