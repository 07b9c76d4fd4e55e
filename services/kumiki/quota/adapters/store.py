"""Postgres: the queue tree, admissions (serialised per subtree and per GPU model), reclaim outbox, usage.

Admission takes row locks in a fixed order, so concurrent admitters never deadlock and never see a stale
sum: the queue rows of the path root first (`SELECT ... FOR UPDATE`), then the capacity rows of the GPU
models the request may use. Every admission in one subtree, and every admission that counts idle GPUs of
a model, therefore runs one after the other; the decision itself is `kumiki.quota.core.decide_admission`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

import asyncpg

from kumiki.common.config import DatabaseSettings
from kumiki.common.db import apply_migrations, create_pool
from kumiki.quota.core import (
    ANY_MODEL,
    Admission,
    AdmitRequest,
    Holding,
    Outcome,
    Queue,
    QuotaConfig,
    Resources,
    build_config,
    choose_victims,
    decide_admission,
    may_submit,
    reclaim_decision_id,
    with_live_capacity,
)

log = logging.getLogger(__name__)


class UnknownQueue(LookupError):
    def __init__(self, queue: str) -> None:
        super().__init__(f"queue: unknown queue {queue!r}")
        self.queue = queue


class NotOwner(PermissionError):
    def __init__(self, queue: str, identity: str) -> None:
        super().__init__(f"queue {queue}: {identity!r} is not one of its owners")
        self.queue = queue


class NoConfig(RuntimeError):
    """No queue file loaded yet (`kumiki quota load --file queues.yaml`)."""


@dataclass(frozen=True)
class AdmitResult:
    admission: Admission
    victims: tuple[Holding, ...] = ()
    repeated: bool = False  # the same job and generation was already admitted


@dataclass(frozen=True)
class UsageRow:
    queue: str
    gpu_model: str
    priority_tier: int
    gpu_seconds: Decimal
    cost: Decimal


async def read_config(connection: asyncpg.Connection) -> tuple[int, QuotaConfig]:
    version = await connection.fetchval("SELECT version FROM quota.config_version")
    if version is None:
        raise NoConfig("no queue file loaded yet: run `kumiki quota load --file queues.yaml`")
    guarantees: dict[str, dict[str, float]] = {}
    for row in await connection.fetch("SELECT path, gpu_model, gpus FROM quota.guarantees"):
        guarantees.setdefault(row["path"], {})[row["gpu_model"]] = row["gpus"]
    queues = [
        Queue(
            path=row["path"],
            parent=row["parent"],
            guarantees=guarantees.get(row["path"], {}),
            limit_gpus=row["limit_gpus"],
            weight=row["weight"],
            priority_tiers=frozenset(row["priority_tiers"]),
            owners=frozenset(row["owners"]),
        )
        for row in await connection.fetch("SELECT * FROM quota.queues")
    ]
    capacity = {row["gpu_model"]: row["gpus"] for row in await connection.fetch("SELECT * FROM quota.capacity")}
    resources = await connection.fetchrow("SELECT cpu_milli, memory_mib FROM quota.cluster_resources")
    rates = {
        row["gpu_model"]: row["rate_per_gpu_hour"] for row in await connection.fetch("SELECT * FROM quota.gpu_rates")
    }
    config = build_config(
        queues,
        capacity,
        cpu_milli=resources["cpu_milli"] if resources else 0.0,
        memory_mib=resources["memory_mib"] if resources else 0.0,
        rates=rates,
    )
    return int(version), config


async def write_config(pool: asyncpg.Pool, config: QuotaConfig, source: str) -> int:
    """Replace the tree, capacity and rates in one transaction (all or nothing); the new version."""
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute("LOCK TABLE quota.queues, quota.capacity IN EXCLUSIVE MODE")
        removed = await connection.fetch(
            "SELECT DISTINCT queue FROM quota.holdings WHERE NOT (queue = ANY($1::text[]))", list(config.queues)
        )
        if removed:
            log.warning(
                "queues removed while holding admitted work; that work keeps its quota until it ends",
                extra={"queues": [row["queue"] for row in removed]},
            )
        await connection.execute("DELETE FROM quota.guarantees")
        await connection.execute("DELETE FROM quota.queues")
        await connection.executemany(
            "INSERT INTO quota.queues (path, parent, depth, limit_gpus, weight, priority_tiers, owners)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7)",
            [
                (q.path, q.parent, q.depth, q.limit_gpus, q.weight, sorted(q.priority_tiers), sorted(q.owners))
                for q in config.queues.values()
            ],
        )
        await connection.executemany(
            "INSERT INTO quota.guarantees (path, gpu_model, gpus) VALUES ($1, $2, $3)",
            [(q.path, model, gpus) for q in config.queues.values() for model, gpus in q.guarantees.items()],
        )
        await connection.execute("DELETE FROM quota.capacity")
        await connection.executemany(
            "INSERT INTO quota.capacity (gpu_model, gpus) VALUES ($1, $2)", list(config.capacity_gpus.items())
        )
        await connection.execute(
            "INSERT INTO quota.cluster_resources (singleton, cpu_milli, memory_mib) VALUES (true, $1, $2)"
            " ON CONFLICT (singleton) DO UPDATE SET cpu_milli = EXCLUDED.cpu_milli, memory_mib = EXCLUDED.memory_mib",
            config.cpu_milli,
            config.memory_mib,
        )
        await connection.execute("DELETE FROM quota.gpu_rates")
        await connection.executemany(
            "INSERT INTO quota.gpu_rates (gpu_model, rate_per_gpu_hour) VALUES ($1, $2)", list(config.rates.items())
        )
        version = await connection.fetchval(
            "INSERT INTO quota.config_version (singleton, version, source) VALUES (true, 1, $1)"
            " ON CONFLICT (singleton) DO UPDATE SET version = quota.config_version.version + 1,"
            " source = EXCLUDED.source, loaded_at = now() RETURNING version",
            source,
        )
    return int(version)


def _holding(row: asyncpg.Record) -> Holding:
    return Holding(
        queue=row["queue"],
        gpus=row["gpus"],
        gpu_model=row["gpu_model"],
        borrowed=row["borrowed"],
        preemptible=row["preemptible"],
        priority_tier=row["priority_tier"],
        job_id=row["job_id"],
        generation=row["generation"],
        seq=row["seq"],
        reclaiming=row["reclaiming"],
        running=row.get("running", True),
    )


class QuotaStore:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        pending_window_s: float = 300.0,
        live: Callable[[], Mapping[str, float] | None] | None = None,
    ) -> None:
        self.pool = pool
        self.pending_window_s = pending_window_s
        self.live = live  # usable GPUs per model now (cluster.state); None, or answering None: the file alone
        self._cached: tuple[int, QuotaConfig] | None = None
        self._pending: dict[str, tuple[float, float]] = {}  # queue -> (GPUs denied, monotonic time)

    async def config(self, connection: asyncpg.Connection | None = None) -> QuotaConfig:
        """The tree, reloaded only when `kumiki quota load` bumped the version, with its capacity shrunk to the
        GPUs the cluster can run work on now."""
        if connection is None:
            async with self.pool.acquire() as acquired:
                return await self.config(acquired)
        version = await connection.fetchval("SELECT version FROM quota.config_version")
        if version is None:
            raise NoConfig("no queue file loaded yet: run `kumiki quota load --file queues.yaml`")
        if self._cached is None or self._cached[0] != version:
            self._cached = await read_config(connection)
        return with_live_capacity(self._cached[1], self.live() if self.live is not None else None)

    async def admit(self, request: AdmitRequest, identity: str | None) -> AdmitResult:
        """Decide and record in one transaction; identity None skips the owner check (anonymous mode)."""
        for _ in range(5):
            async with self.pool.acquire() as connection, connection.transaction():
                result = await self._admit_once(connection, request, identity)
                if result is not None:
                    return result
        raise RuntimeError("the queue tree kept changing during admission; try again")

    async def _admit_once(
        self, connection: asyncpg.Connection, request: AdmitRequest, identity: str | None
    ) -> AdmitResult | None:
        """None when the tree was reloaded between reading it and locking the path (the caller retries)."""
        config = await self.config(connection)
        assert self._cached is not None
        version = self._cached[0]
        if request.queue not in config.queues:
            raise UnknownQueue(request.queue)
        if identity is not None and not may_submit(config, identity, request.queue):
            raise NotOwner(request.queue, identity)
        paths = [queue.path for queue in config.ancestors(request.queue)]
        # `kumiki quota load` locks quota.queues EXCLUSIVE, so once these row locks are held the tree cannot
        # change until commit; a reload that slipped in before them shows as a new version here.
        locked = await connection.fetch(
            "SELECT path FROM quota.queues WHERE path = ANY($1::text[]) ORDER BY depth FOR UPDATE", paths
        )
        if (
            len(locked) != len(paths)
            or await connection.fetchval("SELECT version FROM quota.config_version") != version
        ):
            return None
        models = [request.gpu_model] if request.gpu_model != ANY_MODEL else sorted(config.capacity_gpus)
        await connection.execute(
            "SELECT gpu_model FROM quota.capacity WHERE gpu_model = ANY($1::text[]) ORDER BY gpu_model FOR UPDATE",
            models,
        )
        existing = await connection.fetchrow(
            "SELECT generation, borrowed FROM quota.holdings WHERE job_id = $1", request.job_id
        )
        if existing is not None and existing["generation"] >= request.generation:
            outcome = Outcome.BORROWED if existing["borrowed"] else Outcome.ADMITTED
            return AdmitResult(
                Admission(outcome, "already_admitted", f"job {request.job_id} is already admitted"), repeated=True
            )
        rows = await connection.fetch(
            "SELECT queue, gpu_model, borrowed, sum(gpus) AS gpus FROM quota.holdings WHERE job_id <> $1"
            " GROUP BY queue, gpu_model, borrowed",
            request.job_id,
        )
        holdings = [Holding(r["queue"], r["gpus"], r["gpu_model"], r["borrowed"]) for r in rows]
        admission = decide_admission(config, holdings, request)
        if not admission.admitted:
            self._pending[request.queue] = (request.gpus, time.monotonic())
            return AdmitResult(admission)
        self._pending.pop(request.queue, None)
        victims: list[Holding] = []
        if admission.shortfall_gpus > 0:
            detailed = [
                _holding(row)
                for row in await connection.fetch(
                    "SELECT h.*, EXISTS (SELECT 1 FROM quota.open_intervals o WHERE o.job_id = h.job_id"
                    " AND o.generation = h.generation) AS running FROM quota.holdings h WHERE h.job_id <> $1",
                    request.job_id,
                )
            ]
            victims, uncovered = choose_victims(
                config, detailed, admission.shortfall_gpus, request.queue, request.gpu_model
            )
            if uncovered > 0:
                log.warning(
                    "reclaim cannot cover the shortfall",
                    extra={"queue": request.queue, "job": request.job_id, "uncovered_gpus": uncovered},
                )
            await connection.executemany(
                "UPDATE quota.holdings SET reclaiming = true WHERE job_id = $1 AND generation = $2",
                [(victim.job_id, victim.generation) for victim in victims],
            )
            await connection.executemany(
                "INSERT INTO quota.reclaim_decisions (decision_id, victim_job, victim_generation, victim_queue,"
                " gpus, beneficiary_job, beneficiary_generation, beneficiary_queue)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
                [
                    (
                        reclaim_decision_id(request.job_id, request.generation, victim),
                        victim.job_id,
                        victim.generation,
                        victim.queue,
                        victim.gpus,
                        request.job_id,
                        request.generation,
                        request.queue,
                    )
                    for victim in victims
                ],
            )
        await connection.execute(
            "INSERT INTO quota.holdings (job_id, generation, queue, gpu_model, gpus, priority_tier, preemptible,"
            " borrowed, identity) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
            " ON CONFLICT (job_id) DO UPDATE SET generation = EXCLUDED.generation, queue = EXCLUDED.queue,"
            " gpu_model = EXCLUDED.gpu_model, gpus = EXCLUDED.gpus, priority_tier = EXCLUDED.priority_tier,"
            " preemptible = EXCLUDED.preemptible, borrowed = EXCLUDED.borrowed, reclaiming = false,"
            " identity = EXCLUDED.identity, admitted_at = now()",
            request.job_id,
            request.generation,
            request.queue,
            request.gpu_model,
            request.gpus,
            request.priority_tier,
            request.preemptible,
            admission.outcome is Outcome.BORROWED,
            identity or "anonymous",
        )
        return AdmitResult(admission, tuple(victims))

    async def holdings(self) -> list[Holding]:
        return [_holding(row) for row in await self.pool.fetch("SELECT * FROM quota.holdings")]

    def pending_demand(self) -> dict[str, float]:
        """GPUs recently denied per queue: the demand fair share sees beyond what is held."""
        now = time.monotonic()
        for queue in [q for q, (_, at) in self._pending.items() if now - at > self.pending_window_s]:
            del self._pending[queue]
        return {queue: gpus for queue, (gpus, _) in self._pending.items()}

    async def decayed_usage(self, now_us: int, half_life_s: float) -> dict[str, Resources]:
        """Resource-seconds per queue, each closed interval aged by the half-life from its end."""
        horizon_us = int(now_us - 10 * half_life_s * 1_000_000)
        rows = await self.pool.fetch(
            "SELECT queue, sum(w * gpus::float8) AS gpus, sum(w * cpu_milli) AS cpu, sum(w * memory_mib) AS mem FROM ("
            "  SELECT queue, gpus, cpu_milli, memory_mib,"
            "   (end_us - start_us) / 1e6 * power(0.5, ($1 - end_us) / 1e6 / $2) AS w"
            "  FROM quota.ledger WHERE end_us > $3"
            "  UNION ALL SELECT queue, gpus, cpu_milli, memory_mib, greatest(0, $1 - start_us) / 1e6"
            "  FROM quota.open_intervals) AS usage GROUP BY queue",
            now_us,
            half_life_s,
            horizon_us,
        )
        return {row["queue"]: Resources(row["gpus"] or 0.0, row["cpu"] or 0.0, row["mem"] or 0.0) for row in rows}

    async def usage(self, since_us: int, until_us: int, now_us: int, queue_prefix: str = "") -> list[UsageRow]:
        """GPU-seconds and cost per queue, model and tier in [since, until): closed intervals plus the running
        part of open ones, each clipped to the window, so a job spanning the boundary is split exactly."""
        rows = await self.pool.fetch(
            "SELECT queue, gpu_model, priority_tier,"
            " sum(gpus * (least(end_us, $2) - greatest(start_us, $1)) * 0.000001) AS gpu_seconds FROM ("
            "  SELECT queue, gpu_model, priority_tier, gpus, start_us, end_us FROM quota.ledger"
            "   WHERE end_us > $1 AND start_us < $2"
            "  UNION ALL SELECT queue, gpu_model, priority_tier, gpus, start_us, $3 FROM quota.open_intervals"
            "   WHERE start_us < $2 AND $3 > $1"
            " ) AS intervals WHERE least(end_us, $2) > greatest(start_us, $1)"
            " AND ($4 = '' OR queue = $4 OR queue LIKE $4 || '/%')"
            " GROUP BY queue, gpu_model, priority_tier ORDER BY queue, gpu_model, priority_tier",
            since_us,
            until_us,
            now_us,
            queue_prefix,
        )
        rates = {
            row["gpu_model"]: row["rate_per_gpu_hour"]
            for row in await self.pool.fetch("SELECT gpu_model, rate_per_gpu_hour FROM quota.gpu_rates")
        }
        return [
            UsageRow(
                row["queue"],
                row["gpu_model"],
                row["priority_tier"],
                row["gpu_seconds"],
                row["gpu_seconds"] * rates.get(row["gpu_model"], Decimal(0)) / 3600,
            )
            for row in rows
        ]


async def unpublished_reclaims(connection: asyncpg.Connection, limit: int = 500) -> Sequence[asyncpg.Record]:
    return list(
        await connection.fetch(
            "SELECT * FROM quota.reclaim_decisions WHERE published_at IS NULL ORDER BY created_at, decision_id"
            " LIMIT $1 FOR UPDATE SKIP LOCKED",
            limit,
        )
    )


async def replace_tree(
    database: DatabaseSettings, config: QuotaConfig | None, source: str
) -> tuple[QuotaConfig | None, int | None]:
    """Apply `config` as a new version (None: only read); returns the tree that was there before (None: none was
    loaded) and the new version. Serves `kumiki quota load`, the replay's phases and `kumiki up`'s development
    tree. Raises DatabaseUnavailable or MigrationError, naming the database."""
    pool = await create_pool(database)
    try:
        await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
        await apply_migrations(pool, "quota", "kumiki.quota.migrations")
        async with pool.acquire() as connection:
            try:
                _, previous = await read_config(connection)
            except NoConfig:
                previous = None
        version = None if config is None else await write_config(pool, config, source)
        return previous, version
    finally:
        await pool.close()
