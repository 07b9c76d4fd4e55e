from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg
import pytest


@pytest.fixture
def database_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh database for the services of one test (they share it, each in its own schema, as in a stack)."""
    name = f"sec_{uuid.uuid4().hex[:10]}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(postgres_admin_url)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    yield f"{postgres_admin_url.rpartition('/')[0]}/{name}"
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
