"""The worker's plumbing that needs no broker: node-input partitioning and batch records (flow control is in
test_front_end.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from kumiki.common.config import KafkaSettings
from kumiki.telemetry.adapters.streams import MAX_ITEMS_PER_RECORD, TelemetryStreams
from kumiki.telemetry.core import TelemetryConfig


def streams(partitions: int = 3) -> TelemetryStreams:
    settings = KafkaSettings(bootstrap="127.0.0.1:1", topic_prefix="unit.", default_partitions=partitions)
    return TelemetryStreams(settings, TelemetryConfig(batch_window_s=0.01), producer=None)  # type: ignore[arg-type]


def test_a_node_gets_the_partition_kafkas_default_partitioner_gives_its_key() -> None:
    worker = streams(partitions=6)
    partitioner = DefaultPartitioner()
    for node in ("gpu-node-1", "gpu-node-2", "node-a", "node-b", "a-very-long-node-name-0042", "n"):
        assert worker.partition_for(node) == partitioner(node.encode(), list(range(6)), list(range(6)))


class Topic:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any], int]] = []

    async def send(self, *, key: str, value: dict[str, Any], partition: int) -> asyncio.Future[Any]:
        self.records.append((key, value, partition))
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(partition=partition, offset=len(self.records)))
        return done


async def test_items_go_out_as_batch_records_per_partition_in_order_and_capped() -> None:
    worker = streams()
    topic = Topic()
    nodes = [f"node-{i}" for i in range(40)]
    items = [(node, {"kind": "readings", "node": node, "tick": tick}) for tick in range(12) for node in nodes]
    sent = await worker._send_items(topic, items)
    assert len(sent) == len(topic.records)
    for _, value, partition in topic.records:
        assert value["kind"] == "batch" and 0 < len(value["items"]) <= MAX_ITEMS_PER_RECORD
        assert {worker.partition_for(item["node"]) for item in value["items"]} == {partition}
    unpacked = [item for _, value, _ in topic.records for item in value["items"]]
    assert sorted(map(str, unpacked)) == sorted(str(item) for _, item in items)  # nothing lost or doubled
    for node in nodes:  # a node's items keep their order
        assert [item["tick"] for item in unpacked if item["node"] == node] == list(range(12))
    assert any(len(value["items"]) == MAX_ITEMS_PER_RECORD for _, value, _ in topic.records)
