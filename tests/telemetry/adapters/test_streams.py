"""The worker's plumbing that needs no broker: node-input partitioning, batch records, flow control."""

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


async def test_flow_control_waits_for_this_workers_stage_2_only() -> None:
    worker = streams()
    loop = asyncio.get_running_loop()

    def sent(partition: int, offset: int) -> list[asyncio.Future[Any]]:
        future: asyncio.Future[Any] = loop.create_future()
        future.set_result(SimpleNamespace(partition=partition, offset=offset))
        return [future]

    await worker._wait_folded(sent(2, 9))  # a partition stage 2 here never folded: another worker's
    assert worker.flow_waits == 0

    worker._folded[0] = 3
    waiting = asyncio.create_task(worker._wait_folded(sent(0, 5)))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # stage 2 is at offset 3 of partition 0, the batch ended at 5
    worker._folded[0] = 5
    worker._folded_changed.set()
    await asyncio.wait_for(waiting, 1)
    assert worker.flow_waits == 1

    worker._folded[1] = 0
    waiting = asyncio.create_task(worker._wait_folded(sent(1, 7)))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await worker._forget_folded(set())  # a rebalance: this worker may no longer hold partition 1
    await asyncio.wait_for(waiting, 1)
