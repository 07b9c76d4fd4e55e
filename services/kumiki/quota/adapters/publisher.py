"""Outgoing events: reclaim decisions from the outbox onto scheduling.decisions, and quota.state per queue.

Reclaim decisions are written in the admission's transaction and published here afterwards, marked
published only once the broker acknowledged them: a crash republishes with the same decision id (the
CloudEvents id), which consumers deduplicate. quota.state is compacted: each queue's latest state wins, and
it is published when it changed and on start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from prometheus_client import Gauge

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import QUOTA_STATE, SCHEDULING_DECISIONS
from kumiki.quota.adapters.convert import quota_state, reclaim_event
from kumiki.quota.adapters.store import NoConfig, QuotaStore, unpublished_reclaims
from kumiki.quota.core import QueueStatus, Resources, fair_shares, queue_statuses

log = logging.getLogger(__name__)

QUEUE_GPUS = Gauge(
    "kumiki_quota_queue_gpus",
    "A queue's GPUs by kind: guaranteed, limit (0 = none), used, borrowed, lent, fair_share (as on quota.state)",
    ["queue", "kind"],
)
QUEUE_GPU_KINDS = ("guaranteed", "limit", "used", "borrowed", "lent", "fair_share")


def export_statuses(statuses: list[QueueStatus], exported: set[str]) -> set[str]:
    """Set the per-queue gauges; a queue gone from the tree loses its series. Returns the queues exported."""
    for status in statuses:
        values = (
            status.guaranteed_gpus,
            status.limit_gpus,
            status.used_gpus,
            status.borrowed_gpus,
            status.lent_gpus,
            status.fair_share_gpus,
        )
        for kind, value in zip(QUEUE_GPU_KINDS, values, strict=True):
            QUEUE_GPUS.labels(status.queue, kind).set(value)
    current = {status.queue for status in statuses}
    for queue in exported - current:
        for kind in QUEUE_GPU_KINDS:
            QUEUE_GPUS.remove(queue, kind)
    return current


class Publisher:
    def __init__(
        self, store: QuotaStore, producer: EventProducer, changed: asyncio.Event, interval_s: float, half_life_s: float
    ) -> None:
        self.store = store
        self.producer = producer
        self.changed = changed
        self.interval_s = interval_s
        self.half_life_s = half_life_s
        self._last: dict[str, QueueStatus] = {}
        self._exported: set[str] = set()
        self.reclaims_published = 0

    async def run(self) -> None:
        """Reclaims as soon as an admission writes them (and every interval); queue states every interval."""
        loop = asyncio.get_running_loop()
        next_states = loop.time()
        while True:
            self.changed.clear()
            await self.publish_reclaims()
            if loop.time() >= next_states:
                with contextlib.suppress(NoConfig):
                    await self.publish_states()
                next_states = loop.time() + self.interval_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=max(0.0, next_states - loop.time()))

    async def publish_reclaims(self) -> int:
        published = 0
        async with self.store.pool.acquire() as connection, connection.transaction():
            rows = await unpublished_reclaims(connection)
            if rows:
                await self.producer.publish_many(
                    SCHEDULING_DECISIONS,
                    [(row["victim_job"], reclaim_event(dict(row)), row["decision_id"]) for row in rows],
                )
                await connection.execute(
                    "UPDATE quota.reclaim_decisions SET published_at = now() WHERE decision_id = ANY($1::text[])",
                    [row["decision_id"] for row in rows],
                )
                published = len(rows)
        self.reclaims_published += published
        return published

    async def publish_states(self) -> int:
        config = await self.store.config()
        holdings = await self.store.holdings()
        now_us = time.time_ns() // 1000
        usage = await self.store.decayed_usage(now_us, self.half_life_s)
        demand: dict[str, Resources] = {}
        for holding in holdings:
            demand[holding.queue] = demand.get(holding.queue, Resources()) + Resources(gpus=holding.gpus)
        for queue, gpus in self.store.pending_demand().items():
            demand[queue] = demand.get(queue, Resources()) + Resources(gpus=gpus)
        statuses = queue_statuses(config, holdings, fair_shares(config, demand, usage))
        self._exported = export_statuses(statuses, self._exported)
        changed = [status for status in statuses if self._last.get(status.queue) != status]
        if not changed:
            return 0
        version = now_us
        items = [(status.queue, quota_state(status, version)) for status in changed]
        await self.producer.publish_many(QUOTA_STATE, items)
        for status in changed:
            self._last[status.queue] = status
        return len(changed)
