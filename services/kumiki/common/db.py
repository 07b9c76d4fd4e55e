"""Postgres: a connection pool and versioned SQL migrations, one schema per service.

Migrations are files `NNNN_name.sql` in a package folder. They are applied in order at start, each in
its own transaction together with its row in `<schema>.schema_migrations`, under an advisory lock so
that replicas starting together apply each migration once. An applied file whose text changed is an
error: migrations are append-only.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlparse

import asyncpg

from kumiki.common.config import DatabaseSettings

log = logging.getLogger(__name__)

# The database could not be reached or went away mid-call (a restart, a failover): retry later, not a bug.
UNREACHABLE = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,  # starting up or shutting down
    asyncpg.AdminShutdownError,  # the session was terminated (a fast shutdown, pg_terminate_backend)
    asyncpg.CrashShutdownError,  # another backend crashed: every session is reset
)

_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class DatabaseUnavailable(RuntimeError):
    """Postgres cannot be reached or refuses us; the message names KUMIKI_DATABASE_URL and the cause."""


class MigrationError(RuntimeError):
    """A migration that cannot be applied, or one that changed after it was applied."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(package: str) -> list[Migration]:
    """The migrations shipped in a package folder, in version order; gaps and duplicates are errors."""
    migrations = []
    for entry in resources.files(package).iterdir():
        match = _MIGRATION_NAME.match(entry.name)
        if match:
            migrations.append(Migration(int(match.group(1)), match.group(2), entry.read_text()))
        elif entry.name.endswith(".sql"):
            raise MigrationError(f"{package}/{entry.name}: migration files are named NNNN_name.sql")
    migrations.sort(key=lambda migration: migration.version)
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise MigrationError(f"{package}: expected migration {expected:04d}, found {migration.version:04d}")
    return migrations


async def create_pool(settings: DatabaseSettings) -> asyncpg.Pool:
    """A pool, or DatabaseUnavailable with the redacted URL and the cause."""
    try:
        pool = await asyncpg.create_pool(
            settings.url, min_size=settings.pool_min, max_size=settings.pool_max, timeout=10, command_timeout=30
        )
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        raise DatabaseUnavailable(
            f"KUMIKI_DATABASE_URL: cannot connect to Postgres at {settings.redacted()}: {error}"
        ) from None
    assert pool is not None
    return pool


async def apply_migrations(pool: asyncpg.Pool, schema: str, package: str) -> list[int]:
    """Apply the package's pending migrations inside `schema`; return the versions applied now."""
    if not _SCHEMA_NAME.match(schema):
        raise MigrationError(f"schema {schema!r}: expected a lower-case SQL identifier")
    migrations = load_migrations(package)
    applied_now: list[int] = []
    async with pool.acquire() as connection:
        lock_key = int.from_bytes(hashlib.sha256(schema.encode()).digest()[:8], "big", signed=True)
        await connection.execute("SELECT pg_advisory_lock($1)", lock_key)
        try:
            await connection.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
            await connection.execute(
                f"CREATE TABLE IF NOT EXISTS {schema}.schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            rows = await connection.fetch(f"SELECT version, checksum FROM {schema}.schema_migrations")
            done = {row["version"]: row["checksum"] for row in rows}
            for migration in migrations:
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        raise MigrationError(
                            f"{schema} migration {migration.version:04d}_{migration.name}: changed after it was"
                            " applied; add a new migration instead"
                        )
                    continue
                async with connection.transaction():
                    await connection.execute(f"SET LOCAL search_path TO {schema}, public")
                    try:
                        await connection.execute(migration.sql)
                    except asyncpg.PostgresError as error:
                        raise MigrationError(
                            f"{schema} migration {migration.version:04d}_{migration.name}: {error}"
                        ) from None
                    await connection.execute(
                        f"INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
                applied_now.append(migration.version)
                log.info("applied migration", extra={"schema": schema, "migration": migration.version})
        finally:
            await connection.execute("SELECT pg_advisory_unlock($1)", lock_key)
    return applied_now


def database_name(settings: DatabaseSettings) -> str:
    return urlparse(settings.url).path.lstrip("/") or "postgres"
