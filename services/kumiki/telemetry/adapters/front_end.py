"""Stage 1's aiokafka front end (the default; `front_end="faust"` reads through a faust agent instead), and the
flow control between stage 1 and this worker's stage 2.

A batch's offsets are committed once its records to node-input are acknowledged (at least once; stage 2 skips
a chunk it has already folded in), in batch order while the next batch is fetched. At most two batches are in
stage 2 at a time (`FlowControl`): a worker that falls behind reads bigger batches, whose chunks hold more
ticks per node, and stage 2's cost is per chunk.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer

from kumiki.common.bus.admin import start_client
from kumiki.common.config import KafkaSettings
from kumiki.telemetry import core
from kumiki.telemetry.adapters.consumed import Consumed

Ingest = Callable[[Sequence[Consumed]], Awaitable[list[Any]]]  # stage 1 for one batch → the send futures


class FlowControl:
    """The newest node-input offset stage 2 has folded, per partition this worker holds."""

    def __init__(self, batch_window_s: float) -> None:
        self.batch_window_s = batch_window_s
        self.folded: dict[int, int] = {}
        self.changed = asyncio.Event()
        self.waits = 0  # batches that had to wait

    def fold(self, partition: int, offset: int) -> None:
        self.folded[partition] = offset
        self.changed.set()

    async def forget(self, *args: Any, **kwargs: Any) -> None:
        """After a rebalance this worker may not hold the partitions it waited on: learn them again."""
        self.folded.clear()
        self.changed.set()

    async def wait(self, sent: Sequence[Any]) -> None:
        """Wait until this worker's stage 2 has folded what `sent` put on the partitions it holds (others'
        are another worker's). Meanwhile samples queue up in gpu.samples, so the next batch is bigger, its
        chunks hold more ticks per node, and stage 2 costs less per sample: a worker that falls behind
        catches up instead of spending its time on one-tick chunks."""
        targets: dict[int, int] = {}
        for metadata in await asyncio.gather(*sent):
            targets[metadata.partition] = max(targets.get(metadata.partition, -1), metadata.offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(5.0, 10 * self.batch_window_s)  # never stall on a partition moved away
        waited = False
        while True:
            behind = [p for p, offset in targets.items() if self.folded.get(p, offset) < offset]
            remaining = deadline - loop.time()
            if not behind or remaining <= 0:
                break
            waited = True
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        self.waits += waited


class FrontEnd:
    """Reads `topics` in batches of up to `batch_size` records or `batch_window_s` and hands each to `ingest`."""

    def __init__(
        self,
        settings: KafkaSettings,
        config: core.TelemetryConfig,
        topics: Sequence[str],
        group_id: str,
        ingest: Ingest,
        flow: FlowControl,
        *,
        batch_size: int,
        batch_window_s: float,
    ) -> None:
        self.settings = settings
        self.config = config
        self.topics = list(topics)
        self.group_id = group_id
        self.ingest = ingest
        self.flow = flow
        self.batch_size = batch_size
        self.batch_window_s = batch_window_s
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._consumer = AIOKafkaConsumer(
            *self.topics,
            **self.settings.client_options(),
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.batch_size,
            session_timeout_ms=int(self.config.session_timeout_s * 1000),
            heartbeat_interval_ms=int(min(3.0, self.config.session_timeout_s / 3) * 1000),
        )
        await start_client(self._consumer, self.settings)
        self._task = asyncio.create_task(self._run(), name="telemetry-front-end")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()

    @property
    def failure(self) -> BaseException | None:
        """Why the front end stopped on its own (a failed commit, a broken consumer), else None."""
        task = self._task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            return task.exception()
        return None

    async def _run(self) -> None:
        assert self._consumer is not None
        loop = asyncio.get_running_loop()
        previous: asyncio.Task[None] | None = None
        in_stage_2: collections.deque[list[Any]] = collections.deque()
        while True:
            while len(in_stage_2) >= 2:
                await self.flow.wait(in_stage_2.popleft())
            # Fill a batch up to batch_size or batch_window_s: bigger batches make bigger node chunks, and
            # stage 2's cost is per chunk.
            records: list[Consumed] = []
            offsets: dict[Any, int] = {}
            deadline = loop.time() + self.batch_window_s
            while len(records) < self.batch_size:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                batches = await self._consumer.getmany(
                    timeout_ms=max(1, int(remaining * 1000)), max_records=self.batch_size - len(records)
                )
                for partition, partition_records in batches.items():
                    records += partition_records
                    offsets[partition] = partition_records[-1].offset + 1
            if not records:
                continue
            sent = await self.ingest(records)
            in_stage_2.append(sent)
            # Fetch the next batch while this one's chunks are acknowledged; commits stay in batch order.
            if previous is not None and previous.done():
                previous.result()  # a failed commit stops the front end (and readiness)
            previous = asyncio.create_task(self._commit_after(previous, sent, offsets))

    async def _commit_after(
        self, previous: asyncio.Task[None] | None, sent: list[Any], offsets: dict[Any, int]
    ) -> None:
        if previous is not None:
            await previous
        await asyncio.gather(*sent)
        assert self._consumer is not None
        await self._consumer.commit(offsets)
