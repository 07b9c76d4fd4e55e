"""The watch on the faust group's commits: a stall becomes the service's crash reason, so the process exits
and its restart reads again from the committed offsets (telemetry's tables and folds are idempotent for a
replayed record; at least once).

faust commits the offsets its streams acknowledged, in order; an offset it never saw acknowledged (a
rebalance or an agent restart at the wrong moment) holds every later one back while the agents go on
processing. The group's lag then stays, a restart replays everything since, and nothing says so. This watch
reads what the broker has (the group's committed offsets and the partitions' end offsets, as an operator's
lag query would), not faust's bookkeeping, and names faust's view of each stalled partition in the error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from kumiki.common.bus import progress
from kumiki.common.config import KafkaSettings
from kumiki.telemetry.adapters import metrics

log = logging.getLogger(__name__)


class CommitStalled(RuntimeError):
    """Records wait behind committed offsets that have not moved for the configured time."""


class CommitWatch:
    def __init__(
        self,
        settings: KafkaSettings,
        group: str,
        assigned: Callable[[], Iterable[TopicPartition]],
        stall_s: float,
        *,
        describe: Callable[[TopicPartition], str] = str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.group = group
        self.assigned = assigned  # the group's partitions this worker holds, of the topics it commits on
        self.stall_s = stall_s
        self.check_s = max(0.5, min(10.0, stall_s / 4))
        self.describe = describe
        self.clock = clock
        self.progress: dict[TopicPartition, progress.PartitionProgress] = {}
        self.failure: CommitStalled | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._ends: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, settled: Callable[[], bool]) -> None:
        """`settled`: False while the group rebalances or the tables recover (commits rightly wait then)."""
        self._admin = AIOKafkaAdminClient(**self.settings.client_options(), request_timeout_ms=15000)
        await self._admin.start()
        self._ends = AIOKafkaConsumer(**self.settings.client_options(), group_id=None, enable_auto_commit=False)
        await self._ends.start()
        self._task = asyncio.create_task(self._run(settled), name="telemetry-commit-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._ends is not None:
            await self._ends.stop()
        if self._admin is not None:
            await self._admin.close()

    async def check(self) -> dict[TopicPartition, progress.PartitionProgress]:
        """One look at the broker; returns the stalled partitions."""
        assert self._admin is not None and self._ends is not None
        partitions = sorted(set(self.assigned()))
        if not partitions:
            self.progress = {}
            return {}
        offsets = await self._admin.list_consumer_group_offsets(self.group, partitions=partitions)
        committed = {tp: meta.offset for tp, meta in offsets.items() if meta is not None}
        ends = await self._ends.end_offsets(partitions)
        now = self.clock()
        self.progress = progress.advance(self.progress, committed, ends, now)
        metrics.COMMIT_WAIT.set(progress.oldest_wait_s(self.progress, now))
        return progress.stalled(self.progress, now, self.stall_s)

    async def _run(self, settled: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(self.check_s)
            if not settled():
                self.progress = {}  # the clock starts again once the group has settled
                continue
            try:
                stuck = await self.check()
            except (TimeoutError, KafkaError, OSError) as error:  # the broker away: commits rightly wait
                log.warning("commit watch: cannot read the group's offsets", extra={"error": repr(error)})
                self.progress = {}
                continue
            except Exception:  # a bug here must not end the watch unseen, nor the service
                log.exception("commit watch: the check failed")
                self.progress = {}
                continue
            if stuck:
                parts = [
                    f"{tp.topic}[{tp.partition}] committed {state.committed}, end {state.end} ({self.describe(tp)})"
                    for tp, state in sorted(stuck.items())
                ]
                self.failure = CommitStalled(
                    f"group {self.group}: records wait behind committed offsets that have not moved for"
                    f" {self.stall_s:g} s (KUMIKI_TELEMETRY_COMMIT_STALL_S): {'; '.join(parts)}; exiting so that"
                    " a restart reads them again"
                )
                log.error("commit stalled", extra={"group": self.group, "partitions": "; ".join(parts)})
                return
