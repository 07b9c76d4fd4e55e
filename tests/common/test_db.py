"""Migrations against a real Postgres."""

import pytest

from kumiki.common.config import DatabaseSettings
from kumiki.common.db import DatabaseUnavailable, MigrationError, apply_migrations, create_pool, load_migrations
from kumiki.devstack.processes import free_port


async def test_migrations_apply_once_and_record_versions(database_settings: DatabaseSettings) -> None:
    pool = await create_pool(database_settings)
    try:
        shipped = load_migrations("kumiki.preemption.migrations")
        assert [m.version for m in shipped][:1] == [1] and shipped[0].name == "checkpoints"
        applied = await apply_migrations(pool, "preemption", "kumiki.preemption.migrations")
        assert applied == [m.version for m in shipped]
        assert await apply_migrations(pool, "preemption", "kumiki.preemption.migrations") == []
        versions = await pool.fetch("SELECT version, name FROM preemption.schema_migrations ORDER BY version")
        assert [(row["version"], row["name"]) for row in versions] == [(m.version, m.name) for m in shipped]
        assert await pool.fetchval("SELECT to_regclass('preemption.checkpoints')::text") == "preemption.checkpoints"
    finally:
        await pool.close()


async def test_changed_migration_is_refused(database_settings: DatabaseSettings) -> None:
    pool = await create_pool(database_settings)
    try:
        await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
        await pool.execute("UPDATE kumiki_bus.schema_migrations SET checksum = 'edited' WHERE version = 1")
        with pytest.raises(MigrationError, match="changed after it was applied"):
            await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
    finally:
        await pool.close()


async def test_unreachable_database_names_the_variable() -> None:
    settings = DatabaseSettings(url=f"postgresql://kumiki:pw@127.0.0.1:{free_port()}/kumiki")
    with pytest.raises(DatabaseUnavailable) as error:
        await create_pool(settings)
    assert str(error.value).startswith("KUMIKI_DATABASE_URL: cannot connect to Postgres at postgresql://kumiki:***@")
    assert "pw" not in str(error.value)


def test_every_service_migration_package_is_numbered_without_gaps() -> None:
    for package in ("kumiki.common.migrations", "kumiki.preemption.migrations", "kumiki.forecast.migrations"):
        migrations = load_migrations(package)
        assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
        assert all(m.sql.strip() for m in migrations)
