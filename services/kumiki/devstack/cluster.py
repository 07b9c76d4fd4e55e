"""An emulated cluster for development and tests: NodeState records published on cluster.state, the
same records telemetry ingest publishes for real nodes, so placement cannot tell the difference."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS, CLUSTER_STATE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.grpcutil import timestamp


@dataclass(frozen=True, slots=True)
class NodeShape:
    gpu_model: str
    gpus: int
    gpu_memory_mib: int
    island_size: int  # GPUs per NVLink island (= gpus: one island)
    cpu_milli: int
    memory_mib: int
    mig: bool = False
    shareable: bool = False


# A mixed fleet: NVLink-islanded A100 boxes (some in MIG mode, some shared), H100 boxes, older V100s.
DEFAULT_SHAPES: tuple[NodeShape, ...] = (
    NodeShape("A100-80GB", 8, 81920, 4, 128_000, 1_048_576),
    NodeShape("H100-80GB", 8, 81920, 8, 192_000, 2_097_152),
    NodeShape("V100-32GB", 8, 32768, 4, 64_000, 524_288, shareable=True),
    NodeShape("A100-80GB", 8, 81920, 8, 128_000, 1_048_576, mig=True),
)


def emulated_nodes(
    count: int, shapes: Sequence[NodeShape] = DEFAULT_SHAPES, nodes_per_rack: int = 16, prefix: str = "node"
) -> list[events_pb2.NodeState]:
    """`count` healthy nodes cycling through `shapes`, `nodes_per_rack` to a rack."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    nodes = []
    for index in range(count):
        shape = shapes[index % len(shapes)]
        name = f"{prefix}-{index:05d}"
        gpus = [
            events_pb2.GpuState(
                index=gpu,
                uuid=f"GPU-{name}-{gpu}",
                model=shape.gpu_model,
                memory_mib=shape.gpu_memory_mib,
                nvlink_island=gpu // shape.island_size,
                mig_enabled=shape.mig,
                healthy=True,
                shareable=shape.shareable,
            )
            for gpu in range(shape.gpus)
        ]
        nodes.append(
            events_pb2.NodeState(
                node=name,
                rack=f"rack-{index // nodes_per_rack:04d}",
                gpus=gpus,
                cpu_milli=shape.cpu_milli,
                memory_mib=shape.memory_mib,
                healthy=True,
                last_seen=timestamp(),
                version=common_pb2.EntityVersion(version=1, observed_at=timestamp()),
                labels={"kumiki.dev/emulated": "true"},
            )
        )
    return nodes


async def publish_nodes(settings: KafkaSettings, nodes: Sequence[events_pb2.NodeState]) -> int:
    await ensure_topics(settings, ALL_TOPICS)
    async with EventProducer(settings, "//kumiki/emulated-cluster") as producer:
        return await producer.publish_many(CLUSTER_STATE, [(node.node, node) for node in nodes])
