"""KnownNodes on a real broker: registrations on every partition of node.inventory and cluster.state, a
registration published after start seen only once `catch_up()` runs, invalid records and tombstones."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS, CLUSTER_STATE, NODE_INVENTORY
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.telemetry.adapters.known_nodes import KnownNodes

pytestmark = [pytest.mark.kafka]


async def test_registrations_from_both_topics_and_catch_up(kafka_settings: KafkaSettings) -> None:
    await ensure_topics(kafka_settings, ALL_TOPICS)
    inventory_topic = NODE_INVENTORY.full_name(kafka_settings.topic_prefix)
    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        # Enough nodes to land on every partition of both topics.
        await producer.publish_many(
            NODE_INVENTORY, [(f"agent-{i}", events_pb2.NodeState(node=f"agent-{i}")) for i in range(12)]
        )
        await producer.publish(CLUSTER_STATE, "sim-0", events_pb2.NodeState(node="sim-0"))
        await producer.publish(NODE_INVENTORY, "gone", events_pb2.NodeState(node="gone"))
        raw = AIOKafkaProducer(bootstrap_servers=kafka_settings.bootstrap)
        await raw.start()
        try:
            await raw.send_and_wait(inventory_topic, None, key=b"gone")  # a tombstone
            await raw.send_and_wait(inventory_topic, b"not protobuf", key=b"bogus")  # no CloudEvents headers
        finally:
            await raw.stop()

        known = KnownNodes(kafka_settings, (NODE_INVENTORY, CLUSTER_STATE))
        await known.start()
        try:
            assert all(f"agent-{i}" in known for i in range(12))
            assert "sim-0" in known
            assert "gone" not in known and "bogus" not in known
            assert len({tp.partition for tp in known._partitions}) == kafka_settings.default_partitions

            await producer.publish(NODE_INVENTORY, "late", events_pb2.NodeState(node="late"))
            assert "late" not in known  # nothing reads in the background ...
            await known.catch_up()
            assert "late" in known  # ... but everything acknowledged before catch_up() is read by it
        finally:
            await known.stop()
