"""Reading a topic from its beginning without a consumer group: rebuilding state from the event log.

Placement rebuilds its allocation table from job.lifecycle and its node table from cluster.state
(compacted) this way at start, then keeps following cluster.state. `catch_up` returns once every
partition has reached the end offset it had when the reader started, so "rebuilt" means "rebuilt
from everything published before I started".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

from kumiki.common.bus.admin import BrokerUnavailable, start_client
from kumiki.common.bus.codec import Event, RejectedRecord, decode
from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings

log = logging.getLogger(__name__)

# (key, event) for a record; (key, None) for a tombstone (a compacted entity that was deleted)
RecordHandler = Callable[[str, Event | None], Awaitable[None]]


class TopicReader:
    def __init__(self, settings: KafkaSettings, spec: TopicSpec, handle: RecordHandler) -> None:
        self.settings = settings
        self.spec = spec
        self.handle = handle
        self.topic = spec.full_name(settings.topic_prefix)
        self.records = 0
        self.skipped = 0
        self._consumer = AIOKafkaConsumer(
            **settings.client_options(),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=2000,
        )

    async def start(self) -> None:
        await start_client(self._consumer, self.settings)
        partitions: set[int] = set()
        for _ in range(50):  # a just-created topic takes a moment to appear in metadata
            cluster = await self._consumer._client.fetch_all_metadata()
            partitions = cluster.partitions_for_topic(self.topic) or set()
            if partitions:
                break
            await asyncio.sleep(0.2)
        if not partitions:
            raise BrokerUnavailable(f"topic {self.topic} does not exist (topics are created at start-up)")
        assigned = [TopicPartition(self.topic, partition) for partition in sorted(partitions)]
        self._consumer.assign(assigned)
        await self._consumer.seek_to_beginning(*assigned)

    async def stop(self) -> None:
        await self._consumer.stop()

    async def catch_up(self, timeout_s: float = 600.0) -> int:
        """Handle every record published before this call; returns how many were handled."""
        assigned = list(self._consumer.assignment())
        ends = await self._consumer.end_offsets(assigned)
        handled_before = self.records
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            positions = [await self._consumer.position(partition) for partition in assigned]
            behind = {
                partition.partition: (position, ends[partition])
                for position, partition in zip(positions, assigned, strict=True)
                if position < ends[partition]
            }
            if not behind:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise BrokerUnavailable(
                    f"topic {self.topic}: replay did not reach the end offsets within {timeout_s:.0f}s"
                    f" (partition: (position, end) {behind})"
                )
            await self._poll(timeout_ms=500)
        return self.records - handled_before

    async def follow(self, stopping: asyncio.Event) -> None:
        """Handle new records as they arrive, until `stopping` is set (or the task is cancelled)."""
        while not stopping.is_set():
            await self._poll(timeout_ms=1000)

    async def _poll(self, timeout_ms: int) -> None:
        batches = await self._consumer.getmany(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                await self._one(record)

    async def _one(self, record: ConsumerRecord) -> None:
        key = record.key.decode(errors="replace") if record.key is not None else ""
        if record.value is None:
            await self.handle(key, None)
            self.records += 1
            return
        try:
            event = decode(self.spec, record.key, record.value, list(record.headers or ()))
        except RejectedRecord as error:  # consumers with a group dead-letter these; a replay only counts them
            self.skipped += 1
            log.warning(
                "skipped invalid record", extra={"topic": self.topic, "offset": record.offset, "reason": str(error)}
            )
            return
        await self.handle(key, event)
        self.records += 1
