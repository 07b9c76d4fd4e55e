"""`kumiki quota load | report`: apply the queue tree, and report GPU-hours and cost from the ledger.

Both talk to the quota service's Postgres (KUMIKI_DATABASE_URL, or --database-url). `load` validates the
whole file before touching the database and replaces the tree in one transaction, so a bad file changes
nothing. `report` splits intervals at the window's edges (a job running across --since counts only its
seconds inside the window) and includes the running part of jobs still running.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from kumiki.cli.main import UsageError, message_console
from kumiki.common.config import ConfigError, DatabaseSettings
from kumiki.common.db import DatabaseUnavailable, MigrationError, create_pool
from kumiki.devstack.stack import local_database_url
from kumiki.quota.adapters.store import QuotaStore, UsageRow, replace_tree
from kumiki.quota.core import QueueConfigError, QuotaConfig, parse_config, team_of

console = message_console()
out_console = Console()
GROUPINGS = ("team", "queue", "model")


def _moment(value: str) -> datetime:
    """ISO 8601 date or date-time; without a zone it is UTC."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 date or time (2026-11-01T00:00), got {value!r}"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    quota = subparsers.add_parser("quota", help="load the queue tree; report GPU-hours and cost from the ledger")
    commands = quota.add_subparsers(dest="quota_command", required=True, metavar="SUBCOMMAND")
    load = commands.add_parser("load", help="validate a queues.yaml and apply it (all or nothing)")
    load.add_argument("--file", required=True, type=Path, help="queue file (see docs/examples/queues.yaml)")
    load.add_argument("--check", action="store_true", help="validate only; do not touch the database")
    load.add_argument(
        "--database-url", default=None, help="Postgres URL (default: KUMIKI_DATABASE_URL, else the local stack's)"
    )
    load.set_defaults(handler=_load)
    report = commands.add_parser("report", help="GPU-seconds, GPU-hours and cost per team, queue or GPU model")
    report.add_argument(
        "--since",
        type=_moment,
        default=None,
        help="window start, inclusive (ISO 8601, UTC; default 24 h before --until)",
    )
    report.add_argument(
        "--until", type=_moment, default=None, help="window end, exclusive (ISO 8601, UTC; default now)"
    )
    report.add_argument("--by", choices=GROUPINGS, default="team", help="group rows by team, queue or GPU model")
    report.add_argument("--csv", type=Path, default=Path("quota-report.csv"), help="CSV to write (and a PNG beside)")
    report.add_argument(
        "--database-url", default=None, help="Postgres URL (default: KUMIKI_DATABASE_URL, else the local stack's)"
    )
    report.set_defaults(handler=_report)


def _database(url: str | None) -> DatabaseSettings:
    """--database-url, else KUMIKI_DATABASE_URL, else the local stack's Postgres (`kumiki up`)."""
    env = dict(os.environ)
    if url:
        env["KUMIKI_DATABASE_URL"] = url
    elif not env.get("KUMIKI_DATABASE_URL"):
        local = local_database_url()
        if local:
            env["KUMIKI_DATABASE_URL"] = local
    try:
        return DatabaseSettings.from_env(env)
    except ConfigError as error:
        raise UsageError(f"--database-url: {error}") from None


def read_queue_file(path: Path) -> QuotaConfig:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--file: cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise UsageError(f"--file: {path} is not valid YAML: {error}") from None
    try:
        return parse_config(data)
    except QueueConfigError as error:
        raise UsageError(f"--file: {path}: {error}") from None


def _load(args: argparse.Namespace) -> int:
    config = read_queue_file(args.file)
    if not args.check:
        version = asyncio.run(_apply(config, _database(args.database_url), str(args.file)))
    _print_tree(config)
    console.print(
        f"{args.file}: {len(config.queues)} queues valid" + ("" if args.check else f"; applied as version {version}")
    )
    return 0


async def _apply(config: QuotaConfig, database: DatabaseSettings, source: str) -> int:
    try:
        _, version = await replace_tree(database, config, source)
        assert version is not None
        return version
    except (DatabaseUnavailable, MigrationError) as error:
        raise UsageError(f"--database-url: {error}") from None


def _print_tree(config: QuotaConfig) -> None:
    table = Table(title="queues")
    for column in ("queue", "guarantee (GPUs)", "limit", "weight", "tiers", "owners"):
        table.add_column(column)
    for path in sorted(config.queues):
        queue = config.queues[path]
        guarantee = ", ".join(f"{model or 'any'}: {gpus:g}" for model, gpus in sorted(queue.guarantees.items()))
        table.add_row(
            "  " * queue.depth + path.rsplit("/", 1)[-1],
            guarantee or "-",
            "-" if queue.limit_gpus is None else f"{queue.limit_gpus:g}",
            f"{queue.weight:g}",
            ",".join(str(tier) for tier in sorted(queue.priority_tiers)) or "all",
            ", ".join(sorted(queue.owners)) or "-",
        )
    out_console.print(table)


def group_usage(rows: Sequence[UsageRow], by: str) -> list[tuple[str, Decimal, Decimal]]:
    """(key, GPU-seconds, cost) per team, queue or model, largest first."""
    totals: dict[str, tuple[Decimal, Decimal]] = {}
    for row in rows:
        key = {"team": team_of(row.queue), "queue": row.queue, "model": row.gpu_model or "(any)"}[by]
        seconds, cost = totals.get(key, (Decimal(0), Decimal(0)))
        totals[key] = (seconds + row.gpu_seconds, cost + row.cost)
    return sorted(((key, s, c) for key, (s, c) in totals.items()), key=lambda item: (-item[1], item[0]))


def _report(args: argparse.Namespace) -> int:
    if args.until is None:
        args.until = datetime.now(UTC)
    if args.since is None:
        args.since = args.until - timedelta(days=1)
    if args.until <= args.since:
        raise UsageError(f"--until: must be after --since ({args.since.isoformat()}), got {args.until.isoformat()}")
    rows = asyncio.run(_usage(_database(args.database_url), args.since, args.until))
    grouped = group_usage(rows, args.by)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with args.csv.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow([args.by, "gpu_seconds", "gpu_hours", "cost"])
        for key, seconds, cost in grouped:
            writer.writerow([key, f"{seconds:f}", f"{seconds / 3600:.6f}", f"{cost:.2f}"])
    table = Table(title=f"GPU usage by {args.by}, {args.since.isoformat()} to {args.until.isoformat()}")
    for column in (args.by, "GPU-hours", "GPU-seconds", "cost"):
        table.add_column(column, justify="left" if column == args.by else "right")
    for key, seconds, cost in grouped:
        table.add_row(key, f"{seconds / 3600:,.2f}", f"{seconds:,.0f}", f"{cost:,.2f}")
    total_seconds = sum((seconds for _, seconds, _ in grouped), Decimal(0))
    total_cost = sum((cost for _, _, cost in grouped), Decimal(0))
    table.add_row("total", f"{total_seconds / 3600:,.2f}", f"{total_seconds:,.0f}", f"{total_cost:,.2f}", style="bold")
    out_console.print(table)
    png = args.csv.with_suffix(".png")
    _plot(png, grouped, args.by)
    console.print(f"wrote {args.csv} and {png}")
    return 0


async def _usage(database: DatabaseSettings, since: datetime, until: datetime) -> list[UsageRow]:
    try:
        pool = await create_pool(database)
    except DatabaseUnavailable as error:
        raise UsageError(f"--database-url: {error}") from None
    try:
        store = QuotaStore(pool)
        return await store.usage(
            int(since.timestamp() * 1_000_000), int(until.timestamp() * 1_000_000), time.time_ns() // 1000
        )
    finally:
        await pool.close()


def _plot(path: Path, grouped: Sequence[tuple[str, Decimal, Decimal]], by: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(grouped[:20])
    figure, axis = plt.subplots(figsize=(8, 0.4 * max(3, len(shown)) + 1))
    axis.barh([key for key, _, _ in shown][::-1], [float(s) / 3600 for _, s, _ in shown][::-1], color="#4c72b0")
    axis.set_xlabel("GPU-hours")
    axis.set_title(f"GPU-hours by {by}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
