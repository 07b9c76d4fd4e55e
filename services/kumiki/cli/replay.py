"""`kumiki replay` (a trace through the live services at accelerated time) and `kumiki report` (its
efficiency report, baseline against Kumiki)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kumiki.cli.main import UsageError, message_console
from kumiki.common.config import ConfigError, DatabaseSettings, KafkaSettings
from kumiki.devstack.processes import StackError
from kumiki.devstack.stack import (
    local_bootstrap,
    local_database_url,
    restart_service,
    service_address,
)
from kumiki.replay.core import DEFAULT_PHASES, ReplayError
from kumiki.replay.driver import LiveCounts
from kumiki.replay.report import load_results, markdown, write_report
from kumiki.replay.runner import DEFAULT_TRACE, Endpoints, ReplaySettings, run_session
from kumiki.sim.trace import TraceError

console = message_console()


def add_replay_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, prefix: str = "") -> None:
    """The replay's options; `kumiki up` takes the same ones as --replay-* (prefix 'replay-')."""
    parser.add_argument(f"--{prefix}trace", default=DEFAULT_TRACE, help="trace: CSV path or bundled name")
    parser.add_argument(f"--{prefix}speed", type=float, default=1000.0, help="trace seconds per wall second")
    parser.add_argument(f"--{prefix}nodes", type=int, default=16, help="emulated nodes of 8 GPUs")
    parser.add_argument(
        f"--{prefix}phases",
        default=",".join(DEFAULT_PHASES),
        help="baseline (static quotas, FIFO), kumiki, open (no quota)",
    )
    parser.add_argument(
        f"--{prefix}idle-fraction", type=float, default=0.1, help="share of jobs that hold GPUs and compute nothing"
    )
    parser.add_argument(f"--{prefix}seed", type=int, default=0, help="which jobs are idle")
    parser.add_argument(f"--{prefix}out", type=Path, default=Path("out/replay"), help="where the report goes")
    parser.add_argument(
        f"--{prefix}policy", default=None, help="the kumiki phase's placement policy (default: the stack's own)"
    )


def settings_from(args: argparse.Namespace, prefix: str = "") -> ReplaySettings:
    get: Callable[[str], object] = lambda name: getattr(args, prefix.replace("-", "_") + name)  # noqa: E731
    phases = tuple(phase.strip() for phase in str(get("phases")).split(",") if phase.strip())
    settings = ReplaySettings(
        trace=str(get("trace")),
        nodes=int(get("nodes")),  # type: ignore[call-overload]
        speed=float(get("speed")),  # type: ignore[arg-type]
        phases=phases,
        idle_fraction=float(get("idle_fraction")),  # type: ignore[arg-type]
        seed=int(get("seed")),  # type: ignore[call-overload]
        out=Path(str(get("out"))),
        policy=None if get("policy") is None else str(get("policy")),
    )
    try:
        settings.validate()
    except ReplayError as error:
        raise UsageError(str(error).replace("--", f"--{prefix}", 1)) from None
    return settings


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    replay = subparsers.add_parser("replay", help="replay a trace through the live services, then report")
    add_replay_options(replay)
    replay.add_argument("--placement-address", default=None, help="host:port (default: the local stack's)")
    replay.set_defaults(handler=_replay)
    report = subparsers.add_parser("report", help="the efficiency report of a replay (Markdown and PNG)")
    report.add_argument("--run", type=Path, default=Path("out/replay"), help="a replay's folder or results.json")
    report.set_defaults(handler=_report)


def endpoints(placement_address: str | None = None) -> Endpoints:
    """Where the services are: the options, else the environment, else the local stack (`kumiki up`)."""
    env = dict(os.environ)
    env.setdefault("KUMIKI_KAFKA_BOOTSTRAP", local_bootstrap() or "127.0.0.1:9092")
    if not env.get("KUMIKI_DATABASE_URL") and local_database_url():
        env["KUMIKI_DATABASE_URL"] = str(local_database_url())
    try:
        kafka = KafkaSettings.from_env(env)
        database = DatabaseSettings.from_env(env)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    local = service_address("placement")
    address = placement_address or env.get("KUMIKI_PLACEMENT_ADDRESS") or local or "127.0.0.1:50051"
    restart = None
    if local is not None and address == local:  # the local stack's placement: the baseline may change its policy
        restart = lambda overrides: restart_service("placement", overrides)  # noqa: E731
    return Endpoints(
        placement=address,
        kafka=kafka,
        database=database,
        restart_placement=restart,
        placement_policy=env.get("KUMIKI_PLACEMENT_POLICY", "fifo-backfill"),
        placement_strategy=env.get("KUMIKI_PLACEMENT_STRATEGY", "kumiki"),
        checkpoints=env.get("KUMIKI_CHECKPOINTS_ADDRESS") or service_address("preemption"),
    )


def _view(counts: LiveCounts) -> Table:
    table = Table(title=f"replay: {counts.phase} (GPUs: held / computing / held idle)", show_header=True)
    for column in ("submitted", "waiting", "running", "done", "held", "computing", "idle", "binds/s"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_row(
        f"{counts.submitted}/{counts.planned}",
        str(counts.waiting),
        str(counts.running),
        str(counts.done),
        str(counts.gpus_allocated),
        str(counts.gpus_busy),
        str(counts.idle_gpus),
        f"{counts.binds_per_s:.1f}",
    )
    return table


async def _with_view(settings: ReplaySettings, where: Endpoints) -> dict[str, object]:
    counts = LiveCounts()
    with Live(_view(counts), console=Console(stderr=True), refresh_per_second=4, transient=False) as live:

        async def refresh() -> None:
            while True:
                live.update(_view(counts))
                await asyncio.sleep(0.25)

        refresher = asyncio.create_task(refresh())
        try:
            return await run_session(settings, where, counts=counts)
        finally:
            refresher.cancel()
            live.update(_view(counts))


def run_and_report(settings: ReplaySettings, where: Endpoints) -> int:
    """The replay with its live view, then the report; 1 when an invariant failed."""
    try:
        results = asyncio.run(_with_view(settings, where))
    except (ReplayError, TraceError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    except (StackError, TimeoutError) as error:
        console.print(f"kumiki replay: {error}", style="red", markup=False)
        return 1
    results.pop("_results", None)
    md, png = write_report(results, settings.out)
    print(markdown(results))
    console.print(f"wrote {md} and {png}")
    phases = results["phases"]
    assert isinstance(phases, dict)
    return 1 if any(phase["problems"] for phase in phases.values()) else 0


def _replay(args: argparse.Namespace) -> int:
    return run_and_report(settings_from(args), endpoints(args.placement_address))


def _report(args: argparse.Namespace) -> int:
    try:
        results = load_results(args.run)
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(str(error)) from None
    md, png = write_report(results, args.run if args.run.is_dir() else args.run.parent)
    print(markdown(results))
    console.print(f"wrote {md} and {png}")
    return 0
