"""Which nodes are registered: every partition of kumiki.node.inventory and kumiki.cluster.state, read by
this worker whatever partitions of gpu.samples it owns (a small global view, like a faust GlobalTable).

Ordering: an agent (or the DCGM ingest) publishes its inventory and waits for the broker's acknowledgement
before its first sample. So when a sample names a node not seen yet, `catch_up()` reads both topics up to
their end offsets *as of now*; those offsets are past the inventory, and a node still missing afterwards
never registered. No clock-based grace is needed, and the extra round trip happens only in a batch that
holds an unregistered node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition

from kumiki.common.bus.admin import start_client
from kumiki.common.bus.codec import RejectedRecord, decode
from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings
from kumiki.telemetry.core import NodeRegistry

log = logging.getLogger(__name__)


class KnownNodes:
    """A registry fed from the registration topics; `catch_up()` before trusting a miss."""

    def __init__(self, settings: KafkaSettings, specs: Sequence[TopicSpec]) -> None:
        self.settings = settings
        self.specs = {spec.full_name(settings.topic_prefix): spec for spec in specs}
        self.registry = NodeRegistry()
        self.catch_ups = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[TopicPartition] = []

    @property
    def topic_names(self) -> list[str]:
        return list(self.specs)

    def __contains__(self, node: object) -> bool:
        return node in self.registry

    def add(self, spec: TopicSpec, node: str) -> None:
        """A registration this worker decoded itself (stage 1 reads node.inventory too)."""
        self.registry.record(spec.name, node, True)

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            **self.settings.client_options(), group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        await start_client(self._consumer, self.settings)
        for _ in range(50):  # a just-created topic takes a moment to appear in metadata (as in bus.replay)
            cluster = await self._consumer._client.fetch_all_metadata()
            found = {topic: cluster.partitions_for_topic(topic) for topic in self.specs}
            if all(found.values()):
                break
            await asyncio.sleep(0.1)
        missing = [topic for topic, partitions in found.items() if not partitions]
        if missing:
            raise RuntimeError(f"registration topics missing: {', '.join(missing)}")
        self._partitions = [
            TopicPartition(topic, partition)
            for topic, partitions in found.items()
            for partition in sorted(partitions or ())
        ]
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)
        await self.catch_up()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def catch_up(self) -> None:
        """Read every registration published before this call."""
        consumer = self._consumer
        assert consumer is not None, "start() first"
        self.catch_ups += 1
        ends = await consumer.end_offsets(self._partitions)
        behind = {tp for tp in self._partitions if await consumer.position(tp) < ends[tp]}
        while behind:
            batches = await consumer.getmany(*behind, timeout_ms=1000)
            for tp, records in batches.items():
                spec = self.specs[tp.topic]
                for record in records:
                    self._apply(spec, record.key, record.value, list(record.headers or ()))
            behind = {tp for tp in behind if await consumer.position(tp) < ends[tp]}

    def _apply(self, spec: TopicSpec, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        node_key = key.decode(errors="replace") if key is not None else ""
        if value is None:  # a tombstone: the node left this topic (compaction will drop it too)
            self.registry.record(spec.name, node_key, False)
            return
        if self.registry.has(spec.name, node_key):
            return  # the key is the node: a node already registered here needs no decoding (cluster.state
            # carries this worker's own frequent publications)
        try:
            payload = decode(spec, key, value, headers).payload
        except RejectedRecord as error:
            log.debug("not a registration", extra={"topic": spec.name, "reason": str(error)})
            return  # stage 1 dead-letters a bad inventory; an invalid record registers nothing
        node = str(getattr(payload, "node", ""))
        if node:
            self.registry.record(spec.name, node, True)
