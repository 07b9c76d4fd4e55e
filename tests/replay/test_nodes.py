"""The replay's node agents: samples that follow who holds which GPU, published on a real broker the way the
node agent publishes them (telemetry ingest decodes them with the same codec)."""

from __future__ import annotations

import random

import pytest

from kumiki.common.bus.codec import decode
from kumiki.common.bus.topics import GPU_SAMPLES, NODE_INVENTORY
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.devstack.cluster import emulated_nodes
from kumiki.replay.nodes import BUSY_UTILISATION, IDLE_UTILISATION, GpuUse, NodeAgents, reading
from tests.conftest import read_records


def test_readings_tell_a_computing_job_from_a_zombie_and_a_free_gpu() -> None:
    rng = random.Random(1)
    busy = [reading(GpuUse.BUSY, 81920, rng) for _ in range(200)]
    idle = [reading(GpuUse.IDLE, 81920, rng) for _ in range(200)]
    assert all(BUSY_UTILISATION[0] <= r.utilisation_pct <= BUSY_UTILISATION[1] for r in busy)
    assert all(IDLE_UTILISATION[0] <= r.utilisation_pct <= IDLE_UTILISATION[1] for r in idle)
    assert all(r.memory_used_mib > 0 for r in idle)  # a zombie still holds memory
    free = reading(GpuUse.FREE, 81920, rng)
    assert (free.utilisation_pct, free.memory_used_mib) == (0.0, 0)


def test_samples_follow_holds_and_frees() -> None:
    nodes = emulated_nodes(2, prefix="t")
    agents = NodeAgents(KafkaSettings(), nodes, interval_s=1.0)
    agents.hold("busy-job", [("t-00000", 0), ("t-00000", 1)], idle=False)
    agents.hold("zombie", [("t-00001", 3)], idle=True)
    by_gpu = {(m.node, m.gpu_index): m for _, m in agents.samples(1000.0)}
    assert len(by_gpu) == 16
    assert by_gpu[("t-00000", 0)].gpu_utilization_pct >= BUSY_UTILISATION[0]
    assert by_gpu[("t-00001", 3)].gpu_utilization_pct <= IDLE_UTILISATION[1]
    assert by_gpu[("t-00000", 2)].gpu_utilization_pct == 0.0
    agents.free("busy-job")
    agents.hold("zombie", [("t-00001", 4)], idle=True)  # a new hold replaces the old one
    after = {(m.node, m.gpu_index): m for _, m in agents.samples(1001.0)}
    assert after[("t-00000", 0)].gpu_utilization_pct == 0.0
    assert after[("t-00001", 3)].gpu_utilization_pct == 0.0 and after[("t-00001", 4)].memory_used_mib > 0
    assert after[("t-00001", 4)].sampled_at.seconds == 1001


@pytest.mark.timeout(120)
async def test_agents_publish_the_inventory_then_samples_on_a_real_broker(kafka: KafkaSettings) -> None:
    nodes = emulated_nodes(1, prefix="pub")
    agents = NodeAgents(kafka, nodes, interval_s=0.05)
    agents.hold("job", [("pub-00000", 0)], idle=False)
    await agents.start()
    try:
        samples = await read_records(kafka, GPU_SAMPLES.full_name(kafka.topic_prefix), 8 * 3)
        inventory = await read_records(kafka, NODE_INVENTORY.full_name(kafka.topic_prefix), 1)
    finally:
        await agents.stop()
    assert agents.ticks >= 3 and agents.failed_ticks == 0
    decoded = [decode(GPU_SAMPLES, r.key, r.value, r.headers).payload for r in samples]
    assert all(isinstance(m, events_pb2.GpuSample) and m.node == "pub-00000" for m in decoded)
    assert {m.gpu_index for m in decoded} == set(range(8))
    assert any(m.gpu_index == 0 and m.gpu_utilization_pct >= BUSY_UTILISATION[0] for m in decoded)
    state = decode(NODE_INVENTORY, inventory[0].key, inventory[0].value, inventory[0].headers).payload
    assert isinstance(state, events_pb2.NodeState) and len(state.gpus) == 8 and state.rack
