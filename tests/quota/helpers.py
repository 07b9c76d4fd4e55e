"""Shared pieces of the quota integration tests: a Quota server on loopback over the real Postgres."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc

from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import common_pb2, quota_pb2, quota_pb2_grpc
from kumiki.common.db import apply_migrations, create_pool
from kumiki.quota.adapters.auth import Authenticator, QuotaSettings, token_digest
from kumiki.quota.adapters.grpc import QuotaServicer
from kumiki.quota.adapters.store import QuotaStore, write_config
from kumiki.quota.core import parse_config

TOKENS = {"alice": "token-of-alice-0123", "bob": "token-of-bob-4567", "erin": "token-of-erin-89ab"}


def bearer(identity: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[identity]}"),)


async def migrated_pool(database: DatabaseSettings, **overrides: Any) -> asyncpg.Pool:
    pool = await create_pool(DatabaseSettings(url=database.url, pool_min=1, pool_max=overrides.get("pool_max", 8)))
    await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
    await apply_migrations(pool, "quota", "kumiki.quota.migrations")
    return pool


@dataclass
class QuotaServer:
    pool: asyncpg.Pool
    store: QuotaStore
    stub: quota_pb2_grpc.QuotaStub
    channel: grpc.aio.Channel
    changed: asyncio.Event


@asynccontextmanager
async def quota_server(
    database: DatabaseSettings, config: dict[str, Any], *, pool_max: int = 8, anonymous: bool = False
) -> AsyncIterator[QuotaServer]:
    pool = await migrated_pool(database, pool_max=pool_max)
    await write_config(pool, parse_config(config), "test")
    store = QuotaStore(pool)
    settings = QuotaSettings(
        tokens={} if anonymous else {token_digest(token): who for who, token in TOKENS.items()},
        allow_anonymous=anonymous,
    )
    changed = asyncio.Event()
    server = grpc.aio.server()
    quota_pb2_grpc.add_QuotaServicer_to_server(QuotaServicer(store, Authenticator(settings), changed), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield QuotaServer(pool, store, quota_pb2_grpc.QuotaStub(channel), channel, changed)
    finally:
        await server.stop(None)
        await pool.close()


def admit_request(
    job: str, queue: str, gpus: float, *, preemptible: bool = False, tier: int = 0, model: str = "", generation: int = 1
) -> quota_pb2.AdmitRequest:
    return quota_pb2.AdmitRequest(
        job=common_pb2.JobRef(job_id=job, generation=generation),
        queue=queue,
        gpus=gpus,
        gpu_model=model,
        priority_tier=tier,
        preemptible=preemptible,
    )


def tree(capacity: float = 16, **extra_queues: dict[str, Any]) -> dict[str, Any]:
    """org (guarantee 10) -> team-a (guarantee 10, limit 10, alice), batch (0, erin); other/batch2 (0, erin)."""
    queues = [
        {"name": "org", "guarantee": 10},
        {"name": "team-a", "parent": "org", "guarantee": 10, "limit": 10, "owners": ["alice"]},
        {"name": "batch", "parent": "org", "guarantee": 0, "owners": ["erin"]},
        {"name": "other"},
        {"name": "batch2", "parent": "other", "owners": ["erin"]},
    ]
    queues.extend({"name": name, **fields} for name, fields in extra_queues.items())
    return {"cluster": {"gpus": {"A100": capacity}}, "rates": {"A100": 2.0}, "queues": queues}
