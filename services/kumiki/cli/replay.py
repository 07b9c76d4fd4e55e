"""`kumiki replay` (a trace through the live services at accelerated time) and `kumiki report` (its
efficiency report, baseline against Kumiki)."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from kumiki.cli.main import UsageError, message_console
from kumiki.cli.simulate import add_progress_options, progress_reports_from
from kumiki.common.config import ConfigError, DatabaseSettings, KafkaSettings
from kumiki.common.taskdump import dump_tasks_on_signal
from kumiki.devstack.processes import StackError
from kumiki.devstack.stack import (
    LOCAL_IDLE_RECLAIM,
    local_bootstrap,
    local_database_url,
    restart_service,
    service_address,
    service_env,
)
from kumiki.replay.core import DEFAULT_PHASES, ReplayError
from kumiki.replay.driver import LiveCounts
from kumiki.replay.report import load_results, markdown, write_report
from kumiki.replay.runner import DEFAULT_TRACE, Endpoints, ReplaySettings, run_session
from kumiki.sim.trace import TraceError

console = message_console()
LINE_EVERY_S = 10.0  # the live view's line, where stderr is not a terminal
STILL_EVERY_S = 60.0  # ... and while nothing changes


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
    parser.add_argument(
        f"--{prefix}idle-after-s",
        type=float,
        default=600.0,
        help="trace seconds a zombie's GPUs stay below 5%% before telemetry reports them idle",
    )
    parser.add_argument(f"--{prefix}out", type=Path, default=Path("out/replay"), help="where the report goes")
    parser.add_argument(
        f"--{prefix}policy", default=None, help="the kumiki phase's placement policy (default: the stack's own)"
    )
    parser.add_argument(
        f"--{prefix}via",
        default="auto",
        help="bind (Placement.Bind calls), pods (PodGroups and pods through the binder on the stack's API server),"
        " or auto: pods when `kumiki up --kubernetes` runs, else bind",
    )
    add_progress_options(parser, prefix)


def settings_from(args: argparse.Namespace, prefix: str = "") -> ReplaySettings:
    get: Callable[[str], object] = lambda name: getattr(args, prefix.replace("-", "_") + name)  # noqa: E731
    phases = tuple(phase.strip() for phase in str(get("phases")).split(",") if phase.strip())
    seed = int(get("seed"))  # type: ignore[call-overload]
    settings = ReplaySettings(
        trace=str(get("trace")),
        nodes=int(get("nodes")),  # type: ignore[call-overload]
        speed=float(get("speed")),  # type: ignore[arg-type]
        phases=phases,
        idle_fraction=float(get("idle_fraction")),  # type: ignore[arg-type]
        seed=seed,
        out=Path(str(get("out"))),
        policy=None if get("policy") is None else str(get("policy")),
        idle_after_s=float(get("idle_after_s")),  # type: ignore[arg-type]
        via=str(get("via")),
        progress_reports=progress_reports_from(args, prefix, seed=seed),  # the same jobs as the simulated twin
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
    metrics = report.add_argument_group(
        "from Prometheus", "the figures from a Prometheus server that scraped the services (instead of --run)"
    )
    metrics.add_argument("--prometheus", metavar="URL", default=None, help="http(s)://host:port of Prometheus")
    metrics.add_argument(
        "--start", default=None, help="the range's start: RFC 3339, Unix seconds, or --start=-2h (before now)"
    )
    metrics.add_argument("--end", default="now", help="the range's end (default now)")
    metrics.add_argument("--baseline-start", default=None, help="a 'before' range to compare with: its start")
    metrics.add_argument("--baseline-end", default=None, help="... and its end")
    metrics.add_argument("--json", action="store_true", help="the figures as JSON instead of Markdown")
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
    local_stack = local is not None and address == local  # the baseline may change its policy, telemetry its rule
    kubeconfig = local_kubeconfig() if local_stack else None
    return Endpoints(
        placement=address,
        kafka=kafka,
        database=database,
        restart=restart_service if local_stack else None,
        service_env=service_env if local_stack else None,
        placement_policy=env.get("KUMIKI_PLACEMENT_POLICY", "fifo-backfill"),
        # as the policy: what this environment says, else what a local stack starts placement with (or none)
        placement_idle_reclaim=env.get("KUMIKI_PLACEMENT_IDLE_RECLAIM", LOCAL_IDLE_RECLAIM if local_stack else ""),
        placement_strategy=env.get("KUMIKI_PLACEMENT_STRATEGY", "kumiki"),
        checkpoints=env.get("KUMIKI_CHECKPOINTS_ADDRESS") or service_address("preemption"),
        kubeconfig=kubeconfig,
    )


def local_kubeconfig() -> Path | None:
    """The stack's API server when `kumiki up --kubernetes` runs it with the binder, else None."""
    from kumiki.devstack.kube import kube_running
    from kumiki.devstack.stack import stack_home

    kube = kube_running(stack_home() / "kube")
    if kube is None or service_address("binder") is None:
        return None
    return kube.kubeconfig


def _view(counts: LiveCounts) -> Table:
    table = Table(
        title=f"replay: {counts.phase} (GPUs: held / computing / held idle; idle jobs: found / reclaimed)",
        show_header=True,
    )
    columns = ("submitted", "waiting", "running", "done", "held", "computing", "idle", "found", "reclaimed", "binds/s")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    table.add_row(
        f"{counts.submitted}/{counts.planned}",
        str(counts.waiting),
        str(counts.running),
        str(counts.done),
        str(counts.gpus_allocated),
        str(counts.gpus_busy),
        str(counts.idle_gpus),
        str(counts.idle_found),
        str(counts.idle_reclaimed),
        f"{counts.binds_per_s:.1f}",
    )
    return table


@dataclass
class LogLines:
    """The live view where stderr is not a terminal (CI, a pipe, a file): a line when it changed, at most every
    LINE_EVERY_S, and one every STILL_EVERY_S while nothing does, saying for how long (a stalled replay shows)."""

    last: str = ""
    changed_at: float = 0.0
    printed_at: float = -math.inf

    def due(self, line: str, now: float) -> str | None:
        """What to print now, if anything."""
        if line != self.last and now - self.printed_at >= LINE_EVERY_S:
            self.last, self.changed_at, self.printed_at = line, now, now
            return line
        if line == self.last and now - self.printed_at >= STILL_EVERY_S:
            self.printed_at = now
            return f"{line} (no change for {now - self.changed_at:.0f} s)"
        return None


def _line(counts: LiveCounts) -> str:
    """The live view as one log line, for a console that is not a terminal (CI, a pipe, a file)."""
    return (
        f"replay {counts.phase}: submitted {counts.submitted}/{counts.planned}, waiting {counts.waiting}, "
        f"running {counts.running}, done {counts.done}; GPUs held {counts.gpus_allocated}, "
        f"computing {counts.gpus_busy}; idle jobs found {counts.idle_found}, reclaimed {counts.idle_reclaimed}"
    )


async def _with_view(settings: ReplaySettings, where: Endpoints) -> dict[str, object]:
    dump_tasks_on_signal("kumiki replay")  # `kill -USR1` shows where a replay that seems stuck waits
    counts = LiveCounts()
    view = Console(stderr=True)
    with Live(_view(counts), console=view, refresh_per_second=4, transient=False) as live:

        async def refresh() -> None:
            lines = LogLines()  # a terminal redraws the table; anything else gets lines
            while True:
                if view.is_terminal:
                    live.update(_view(counts))
                elif counts.phase:  # nothing to say while the cluster and queues are set up
                    line = lines.due(_line(counts), time.monotonic())
                    if line is not None:
                        print(line, file=sys.stderr, flush=True)
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
    if args.prometheus is not None or args.start is not None:
        return _report_from_prometheus(args)
    try:
        results = load_results(args.run)
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(str(error)) from None
    md, png = write_report(results, args.run if args.run.is_dir() else args.run.parent)
    print(markdown(results))
    console.print(f"wrote {md} and {png}")
    return 0


def _report_from_prometheus(args: argparse.Namespace) -> int:
    """`--prometheus URL --start T [--end T]`: exit 2 for a bad option or an empty range, 1 when Prometheus
    cannot be asked (each message names the flag)."""
    import json

    from kumiki.replay.prometheus_source import PrometheusError, SourceUsageError, report

    if args.prometheus is None:
        raise UsageError("--prometheus: required with --start (the Prometheus server to read the figures from)")
    if args.start is None:
        raise UsageError("--start: required with --prometheus (the run's start: RFC 3339, Unix seconds or -2h)")
    if (args.baseline_start is None) != (args.baseline_end is None):
        raise UsageError("--baseline-start/--baseline-end: give both, or neither")
    baseline = (args.baseline_start, args.baseline_end) if args.baseline_start is not None else ()
    try:
        text, figures = report(args.prometheus, args.start, args.end, baseline)
    except SourceUsageError as error:
        raise UsageError(str(error)) from None
    except PrometheusError as error:
        console.print(f"kumiki report: {error}", style="red", markup=False)
        return 1
    print(json.dumps(figures, indent=2) if args.json else text)
    return 0
