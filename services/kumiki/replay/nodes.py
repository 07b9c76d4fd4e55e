"""The replay's node agents: every emulated node sends what a real node agent sends from NVML, its inventory on
node.inventory and one GpuSample per GPU on gpu.samples at a fixed interval, with utilisation that follows the
jobs bound to it (a computing job's GPUs busy, a zombie's near zero, free GPUs at zero).

Telemetry ingest cannot tell these samples from a real agent's: it tracks the GPUs' holders from job.lifecycle,
finds the zombies idle past their queue's rule (gpu.idle), and placement's idle reclaim acts on those findings
as it would on a real cluster. Nothing here decides anything; the driver tells the agents who holds what.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import GPU_SAMPLES, NODE_INVENTORY
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2

log = logging.getLogger(__name__)

# What a training job's GPUs show in NVML (busy) and what a GPU nobody computes on shows (idle, free).
BUSY_UTILISATION = (70.0, 99.0)
IDLE_UTILISATION = (0.0, 2.0)
ZOMBIE_MEMORY_SHARE = 0.3  # a zombie still holds its model in memory: what tells it from a free GPU in nvidia-smi


class GpuUse(Enum):
    FREE = "free"
    BUSY = "busy"
    IDLE = "idle"  # held by a job that computes nothing


@dataclass(frozen=True, slots=True)
class Reading:
    utilisation_pct: float
    memory_used_mib: int


def reading(use: GpuUse, memory_total_mib: int, rng: random.Random) -> Reading:
    """One GPU's sample for how it is used (pure, given the random source)."""
    if use is GpuUse.BUSY:
        return Reading(rng.uniform(*BUSY_UTILISATION), int(memory_total_mib * rng.uniform(0.5, 0.9)))
    if use is GpuUse.IDLE:
        return Reading(rng.uniform(*IDLE_UTILISATION), int(memory_total_mib * ZOMBIE_MEMORY_SHARE))
    return Reading(0.0, 0)


class NodeAgents:
    """The agents of a set of emulated nodes, publishing from one task until `stop`."""

    def __init__(
        self, kafka: KafkaSettings, nodes: Sequence[events_pb2.NodeState], *, interval_s: float, seed: int = 0
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.kafka = kafka
        self.nodes = list(nodes)
        self.interval_s = interval_s
        self._rng = random.Random(seed)
        self._use: dict[tuple[str, int], GpuUse] = {}
        self._held: dict[str, frozenset[tuple[str, int]]] = {}
        self._producer: EventProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self.samples_published = 0
        self.ticks = 0
        self.failed_ticks = 0

    def hold(self, job_id: str, gpus: Iterable[tuple[str, int]], *, idle: bool) -> None:
        """A job now holds these GPUs: from the next tick they show its use."""
        self.free(job_id)
        held = frozenset(gpus)
        self._held[job_id] = held
        for gpu in held:
            self._use[gpu] = GpuUse.IDLE if idle else GpuUse.BUSY

    def free(self, job_id: str) -> None:
        for gpu in self._held.pop(job_id, frozenset()):
            self._use.pop(gpu, None)

    def samples(self, now: float) -> list[tuple[str, events_pb2.GpuSample]]:
        """One tick's samples, keyed as the real agent keys them ("<node>/<gpu uuid>")."""
        out = []
        for node in self.nodes:
            for gpu in node.gpus:
                use = self._use.get((node.node, gpu.index), GpuUse.FREE)
                value = reading(use, gpu.memory_mib, self._rng)
                message = events_pb2.GpuSample(
                    node=node.node,
                    gpu_uuid=gpu.uuid,
                    gpu_index=gpu.index,
                    gpu_model=gpu.model,
                    gpu_utilization_pct=value.utilisation_pct,
                    memory_used_mib=value.memory_used_mib,
                    memory_total_mib=gpu.memory_mib,
                    source="kumiki-replay",
                )
                message.sampled_at.FromNanoseconds(int(now * 1e9))
                out.append((f"{node.node}/{gpu.uuid}", message))
        return out

    async def start(self) -> None:
        await ensure_topics(self.kafka, [GPU_SAMPLES, NODE_INVENTORY])
        self._producer = EventProducer(self.kafka, "//kumiki/replay/agents")
        await self._producer.start()
        # the inventory first, as a real agent sends it at start: telemetry's view of the node is built from it
        await self._producer.publish_many(NODE_INVENTORY, [(node.node, node) for node in self.nodes])
        await self._tick()
        self._task = asyncio.create_task(self._run(), name="replay-node-agents")

    async def _tick(self) -> None:
        assert self._producer is not None
        self.samples_published += await self._producer.publish_many(GPU_SAMPLES, self.samples(time.time()))
        self.ticks += 1

    async def _run(self) -> None:
        next_at = time.monotonic()
        while True:
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            try:
                await self._tick()
            except Exception as error:  # the broker restarting: the next tick tries again, as a real agent does
                self.failed_ticks += 1
                log.warning("node agents: a tick's samples were not published", extra={"error": repr(error)})
            next_at = max(next_at, time.monotonic() - self.interval_s)  # a slow tick is not made up in a burst

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
