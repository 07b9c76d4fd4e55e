"""The real Checkpoints service on loopback over a real Postgres registry, for the tests that report to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import grpc

from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import checkpoints_pb2_grpc
from kumiki.common.db import apply_migrations, create_pool
from kumiki.preemption.adapters.grpc import CheckpointsServicer
from kumiki.preemption.adapters.identity import JobIdentity
from kumiki.preemption.adapters.registry import CheckpointRegistry


@asynccontextmanager
async def checkpoints_service(
    database_settings: DatabaseSettings, identity: JobIdentity | None = None
) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    """Yields the service's address and the registry's pool; stopped and closed afterwards (`identity` too)."""
    pool = await create_pool(database_settings)
    await apply_migrations(pool, "preemption", "kumiki.preemption.migrations")
    server = grpc.aio.server()
    servicer = CheckpointsServicer(CheckpointRegistry(pool), identity=identity)
    checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", pool
    finally:
        await server.stop(None)
        if identity is not None:
            await identity.close()
        await pool.close()
