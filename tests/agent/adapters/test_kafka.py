"""The agent's Kafka sink: sample and inventory messages, and a round trip through a real broker decoded
by the bus codec (Apache Kafka and noida-db)."""

from __future__ import annotations

from kumiki.agent.adapters.kafka import KafkaSink, inventory_message, nvlink_islands, sample_message
from kumiki.agent.core import GpuDevice, GpuInventory, GpuPair, GpuSample, MigInstance, SampleFields
from kumiki.common.bus import decode
from kumiki.common.bus.topics import GPU_SAMPLES, NODE_INVENTORY
from kumiki.common.config import KafkaSettings
from tests.conftest import read_records

GIB = 1024**3


def inventory() -> GpuInventory:
    migs = (MigInstance(1, 0, "MIG-1", "3g.40gb", 40 * GIB, placement_start=4, placement_size=4),)
    gpus = tuple(
        GpuDevice(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 80 * GIB, None, i == 3, migs if i == 3 else ())
        for i in range(4)
    )
    pairs = (GpuPair(0, 1, "SINGLE", 12, True), GpuPair(2, 3, "NODE", 0, True), GpuPair(1, 2, "SYSTEM", 0, False))
    return GpuInventory("node-1", 1.0, "550.54.15", "12.4", gpus, pairs)


def test_nvlink_islands_are_connected_components_named_by_their_lowest_index() -> None:
    assert nvlink_islands(inventory()) == {0: 0, 1: 0, 2: 2, 3: 2}


def test_inventory_message_carries_memory_mig_layout_and_topology() -> None:
    message = inventory_message(inventory())
    assert [(g.index, g.memory_mib, g.nvlink_island, g.mig_enabled) for g in message.gpus] == [
        (0, 81920, 0, False),
        (1, 81920, 0, False),
        (2, 81920, 2, False),
        (3, 81920, 2, True),
    ]
    assert list(message.gpus[3].mig_slices) == ["3g.40gb@4"]
    assert message.labels["kumiki.dev/pcie-1-2"] == "SYSTEM"
    assert message.labels["kumiki.dev/nvidia-driver"] == "550.54.15"


def test_sample_message_converts_units_and_keeps_unset_fields_unset() -> None:
    sample = GpuSample(
        "node-1",
        "GPU-0",
        0,
        2,
        1700000000.25,
        SampleFields(gpu_util_pct=None, memory_used_bytes=3 * GIB + 5, memory_total_bytes=40 * GIB, xid_errors=(79,)),
        labels={"pod": "p", "namespace": "ns"},
        model="A100",
        source="nvml",
    )
    message = sample_message(sample)
    assert not message.HasField("gpu_utilization_pct") and not message.HasField("power_w")
    assert (message.memory_used_mib, message.memory_total_mib, message.mig_instance_id) == (3072, 40960, 2)
    assert message.sampled_at.ToNanoseconds() == 1700000000_250000000
    assert (list(message.xid_errors), message.pod, message.namespace, message.source) == ([79], "p", "ns", "nvml")


async def test_samples_and_inventory_round_trip_through_the_broker(kafka_settings: KafkaSettings) -> None:
    sink = await KafkaSink.open(kafka_settings, source="//kumiki/agent/test")
    samples = [
        GpuSample("node-1", f"GPU-{i}", i, None, 1700000000.0 + i, SampleFields(gpu_util_pct=10.0 * i))
        for i in range(3)
    ]
    try:
        await sink.publish_inventory(inventory())
        await sink.publish(samples)
    finally:
        await sink.close()
    specs = {spec.full_name(kafka_settings.topic_prefix): spec for spec in (GPU_SAMPLES, NODE_INVENTORY)}
    records = await read_records(kafka_settings, list(specs), 4)
    events = [decode(specs[r.topic], r.key, r.value, list(r.headers)) for r in records]
    by_topic = {event.topic.name: [] for event in events}
    for event in events:
        by_topic[event.topic.name].append(event)
    (inventory_event,) = by_topic["node.inventory"]
    assert inventory_event.key == "node-1" and len(inventory_event.payload.gpus) == 4
    got = sorted(by_topic["gpu.samples"], key=lambda event: event.key)
    assert [event.key for event in got] == ["node-1/GPU-0", "node-1/GPU-1", "node-1/GPU-2"]
    assert [event.payload.gpu_utilization_pct for event in got] == [0.0, 10.0, 20.0]
    assert {event.attributes.source for event in events} == {"//kumiki/agent/test"}
