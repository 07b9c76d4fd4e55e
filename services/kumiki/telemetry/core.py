"""Telemetry ingest's pure core: the latest reading per GPU and utilisation rolled up per node.

The windowed faust aggregation, cluster.state and idle detection build on this (issue: telemetry ingest).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuReading:
    node: str
    gpu_uuid: str
    sampled_unix_s: float
    utilization_pct: float | None
    memory_used_mib: int | None


@dataclass
class FleetUtilisation:
    """Latest reading of each GPU; out-of-order samples never overwrite newer ones."""

    latest: dict[tuple[str, str], GpuReading] = field(default_factory=dict)

    def update(self, reading: GpuReading) -> bool:
        key = (reading.node, reading.gpu_uuid)
        current = self.latest.get(key)
        if current is not None and current.sampled_unix_s >= reading.sampled_unix_s:
            return False
        self.latest[key] = reading
        return True

    def node_utilisation(self, node: str) -> float | None:
        values = [r.utilization_pct for (n, _), r in self.latest.items() if n == node and r.utilization_pct is not None]
        return sum(values) / len(values) if values else None
