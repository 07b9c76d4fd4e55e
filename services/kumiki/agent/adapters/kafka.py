"""The agent's Kafka sink: kumiki.v1.GpuSample on kumiki.gpu.samples (key "<node>/<gpu uuid>") and the
node inventory as a kumiki.v1.NodeState on kumiki.node.inventory (compacted, key = node), both through the
bus EventProducer (CloudEvents headers, traceparent, acks=all, idempotence).

Broker settings come from the same KUMIKI_KAFKA_* variables as every service.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from kumiki.agent.core import GpuInventory, GpuSample
from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.access import ACCESS
from kumiki.common.bus.topics import GPU_SAMPLES, NODE_INVENTORY
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.common.token_file import TokenFile
from kumiki.telemetry.core.agents import AGENT_SIGNATURE_HEADER, AGENT_TOKEN_HEADER, signature  # telemetry's

MIB = 1024 * 1024


def sample_message(sample: GpuSample) -> events_pb2.GpuSample:
    """Bytes become MiB (rounded down, as nvidia-smi shows them); unset fields stay unset."""
    values = sample.fields
    message = events_pb2.GpuSample(
        node=sample.node,
        gpu_uuid=sample.gpu_uuid,
        gpu_index=sample.gpu_index,
        gpu_model=sample.model or "",
        pod=sample.labels.get("pod", ""),
        namespace=sample.labels.get("namespace", ""),
        source=sample.source or "",
        xid_errors=list(values.xid_errors),
    )
    whole = math.floor(sample.timestamp)  # split first: t * 1e9 in a double loses the nanoseconds
    message.sampled_at.FromNanoseconds(whole * 1_000_000_000 + round((sample.timestamp - whole) * 1e9))
    if sample.mig_instance_id is not None:
        message.mig_instance_id = sample.mig_instance_id
    if values.gpu_util_pct is not None:
        message.gpu_utilization_pct = values.gpu_util_pct
    if values.memory_util_pct is not None:
        message.memory_utilization_pct = values.memory_util_pct
    if values.memory_used_bytes is not None:
        message.memory_used_mib = values.memory_used_bytes // MIB if values.memory_used_bytes >= 0 else 0
    if values.memory_total_bytes is not None:
        message.memory_total_mib = values.memory_total_bytes // MIB if values.memory_total_bytes >= 0 else 0
    if values.power_w is not None:
        message.power_w = values.power_w
    if values.temperature_c is not None:
        message.temperature_c = values.temperature_c
    if values.ecc_corrected_volatile is not None and values.ecc_corrected_volatile >= 0:
        message.ecc_corrected = values.ecc_corrected_volatile
    if values.ecc_uncorrected_volatile is not None and values.ecc_uncorrected_volatile >= 0:
        message.ecc_uncorrected = values.ecc_uncorrected_volatile
    return message


def nvlink_islands(inventory: GpuInventory) -> dict[int, int]:
    """GPU index → island id (the lowest index of its NVLink-connected component)."""
    island = {gpu.index: gpu.index for gpu in inventory.gpus}

    def root(index: int) -> int:
        while island[index] != index:
            index = island[index]
        return index

    for pair in inventory.pairs:
        if pair.a in island and pair.b in island and (pair.nvlinks > 0 or pair.nvlink_p2p is True):
            low, high = sorted((root(pair.a), root(pair.b)))
            island[high] = low
    return {index: root(index) for index in island}


TOPOLOGY_LABEL = "kumiki.dev/pcie-{a}-{b}"


def inventory_message(inventory: GpuInventory) -> events_pb2.NodeState:
    """The agent's static view of the node; telemetry ingest adds health, utilisation and holders."""
    islands = nvlink_islands(inventory)
    labels = {TOPOLOGY_LABEL.format(a=pair.a, b=pair.b): pair.topology for pair in inventory.pairs if pair.topology}
    if inventory.driver_version:
        labels["kumiki.dev/nvidia-driver"] = inventory.driver_version
    if inventory.cuda_driver_version:
        labels["kumiki.dev/cuda-driver"] = inventory.cuda_driver_version
    return events_pb2.NodeState(
        node=inventory.node,
        gpus=[
            events_pb2.GpuState(
                index=gpu.index,
                uuid=gpu.uuid,
                model=gpu.name or "",
                memory_mib=(gpu.memory_total_bytes or 0) // MIB,
                nvlink_island=islands[gpu.index],
                mig_enabled=bool(gpu.mig_enabled),
                mig_slices=[
                    f"{mig.profile}@{mig.placement_start if mig.placement_start is not None else '?'}"
                    for mig in gpu.mig_instances
                    if mig.profile
                ],
                healthy=True,
            )
            for gpu in inventory.gpus
        ],
        healthy=True,
        labels=labels,
    )


def read_node_key(path: Path) -> bytes:
    """This node's key as `kumiki telemetry node-key` prints it (64 hex characters); ValueError says what is wrong."""
    try:
        key = path.read_bytes().strip()
    except OSError as error:
        raise ValueError(f"cannot read {str(path)!r}: {error.strerror}") from None
    if len(key) != 64 or any(c not in b"0123456789abcdef" for c in key):
        raise ValueError(f"{str(path)!r} does not hold a node key (64 hex characters, from kumiki telemetry node-key)")
    return key


TOKEN_RECHECK_S = 1.0  # the kubelet replaces a projected token at 80% of its life: minutes, not seconds


def proof_headers(
    token_file: Path | None, node_key_file: Path | None
) -> Callable[[bytes], list[tuple[str, bytes]]] | None:
    """The producer's per-record headers that prove this node to telemetry ingest (None: no proof)."""
    if token_file is not None:
        token = TokenFile(token_file, "--token-file", recheck_s=TOKEN_RECHECK_S)
        return lambda value: [(AGENT_TOKEN_HEADER, token.refresh().encode())]
    if node_key_file is not None:
        key = read_node_key(node_key_file)
        return lambda value: [(AGENT_SIGNATURE_HEADER, signature(key, value))]
    return None


class KafkaSink:
    """SampleSink and InventorySink: one publish_many per tick, acknowledged before the next tick."""

    def __init__(self, producer: EventProducer) -> None:
        self.producer = producer

    @classmethod
    async def open(
        cls,
        settings: KafkaSettings | None = None,
        *,
        source: str | None = None,
        token_file: Path | None = None,
        node_key_file: Path | None = None,
    ) -> KafkaSink:
        """How the agent proves its node to telemetry ingest, on every record: `token_file`, the pod's projected
        ServiceAccount token (`kumiki-agent-token`, read again when the kubelet rotates it), or `node_key_file`,
        this node's key, which signs each record's bytes (`kumiki-agent-signature`)."""
        settings = settings or KafkaSettings.from_env(os.environ)
        access = ACCESS["agent"]  # on a broker with ACLs: samples and inventory, nothing else
        await ensure_topics(settings, access.topics)
        producer = EventProducer(
            settings,
            source or f"//kumiki/agent/{os.uname().nodename}",
            writes=access.writes,
            headers=proof_headers(token_file, node_key_file),
        )
        await producer.start()
        return cls(producer)

    async def publish_inventory(self, inventory: GpuInventory) -> None:
        await self.producer.publish(NODE_INVENTORY, inventory.node, inventory_message(inventory))

    async def publish(self, samples: Sequence[GpuSample]) -> None:
        await self.producer.publish_many(
            GPU_SAMPLES, [(f"{sample.node}/{sample.gpu_uuid}", sample_message(sample)) for sample in samples]
        )

    async def close(self) -> None:
        await self.producer.stop()
