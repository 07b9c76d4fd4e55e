"""gpu.samples → latest reading per GPU and Prometheus gauges (invalid samples are dead-lettered by the bus)."""

from __future__ import annotations

import asyncpg
from prometheus_client import Gauge

from kumiki.common.bus import Event
from kumiki.common.contracts.v1 import events_pb2
from kumiki.telemetry.core import FleetUtilisation, GpuReading

GPU_UTILISATION = Gauge("kumiki_gpu_utilization_percent", "Latest SM utilisation per GPU", ["node", "gpu"])
NODE_UTILISATION = Gauge("kumiki_node_gpu_utilization_percent", "Mean SM utilisation of a node's GPUs", ["node"])


class SampleHandler:
    def __init__(self, fleet: FleetUtilisation) -> None:
        self.fleet = fleet

    async def __call__(self, event: Event, connection: asyncpg.Connection | None) -> None:
        sample = event.payload
        assert isinstance(sample, events_pb2.GpuSample)
        reading = GpuReading(
            node=sample.node,
            gpu_uuid=sample.gpu_uuid,
            sampled_unix_s=sample.sampled_at.seconds + sample.sampled_at.nanos / 1e9,
            utilization_pct=sample.gpu_utilization_pct if sample.HasField("gpu_utilization_pct") else None,
            memory_used_mib=sample.memory_used_mib if sample.HasField("memory_used_mib") else None,
        )
        if self.fleet.update(reading) and reading.utilization_pct is not None:
            GPU_UTILISATION.labels(sample.node, sample.gpu_uuid).set(reading.utilization_pct)
            node_value = self.fleet.node_utilisation(sample.node)
            if node_value is not None:
                NODE_UTILISATION.labels(sample.node).set(node_value)
