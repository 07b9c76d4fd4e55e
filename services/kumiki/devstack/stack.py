"""`kumiki up`, `status`, `down`: the whole stack as local processes, with its state in KUMIKI_HOME/stack.json."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kumiki.common.config import EXIT_PORT_IN_USE, service_prefix
from kumiki.devstack.broker import start_broker
from kumiki.devstack.postgres import start_postgres, stop_postgres
from kumiki.devstack.processes import (
    StackError,
    alive,
    can_bind,
    exit_status,
    free_port,
    port_open,
    spawn,
    terminate,
    terminate_all,
)

# service name -> python module that runs it, in start order (quota before placement, which admits through it)
SERVICES: dict[str, str] = {
    "telemetry-ingest": "kumiki.telemetry",
    "forecast": "kumiki.forecast",
    "quota": "kumiki.quota",
    "placement": "kumiki.placement",
    "preemption": "kumiki.preemption",
}
# The services' own default ports (their ServiceSpec, README "Configuration"): `up` uses them when they are free,
# so every command finds the stack at the addresses the README names; a taken port falls back to a free one and
# the CLI reads the real one from stack.json.
DEFAULT_PORTS: dict[str, tuple[int, int]] = {
    "placement": (50051, 8081),
    "forecast": (50052, 8082),
    "quota": (50053, 8083),
    "preemption": (50054, 8084),
    "telemetry-ingest": (50055, 8085),
    "binder": (50057, 8087),  # only with `kumiki up --kubernetes`
}


CLI_IDENTITY = "kumiki-cli"  # the common name of the CLI's (and the replay's) certificate under `up --tls`


def stack_home() -> Path:
    return Path(os.environ.get("KUMIKI_HOME", Path.cwd() / ".kumiki")).resolve()


@dataclass
class StackState:
    home: Path
    broker: dict[str, Any] | None = None
    database: dict[str, Any] | None = None
    services: dict[str, dict[str, Any]] = field(default_factory=dict)
    tls: dict[str, Any] | None = None  # `up --tls`: {"folder": the development CA's, "client": the CLI's identity}

    @property
    def path(self) -> Path:
        return self.home / "stack.json"

    @classmethod
    def load(cls, home: Path) -> StackState:
        path = home / "stack.json"
        if not path.exists():
            return cls(home)
        data = json.loads(path.read_text())
        return cls(home, data.get("broker"), data.get("database"), data.get("services", {}), data.get("tls"))

    def save(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        payload = {"broker": self.broker, "database": self.database, "services": self.services, "tls": self.tls}
        self.path.write_text(json.dumps(payload, indent=2))


# a job telemetry reports idle (gpu.idle) gives its GPUs to a waiting job: checkpointed, evicted, requeued
LOCAL_IDLE_RECLAIM = "*=waiting:0"


def launch_env(state: StackState, name: str, grpc_port: int, http_port: int) -> dict[str, str]:
    """The environment a stack service starts with: the stack's broker, database and neighbours' addresses."""
    env = dict(os.environ)
    prefix = service_prefix(name)
    assert state.broker is not None and state.database is not None
    env.update(
        {
            "KUMIKI_KAFKA_BOOTSTRAP": state.broker["bootstrap"],
            "KUMIKI_DATABASE_URL": state.database["url"],
            f"{prefix}_GRPC_PORT": str(grpc_port),
            f"{prefix}_HTTP_PORT": str(http_port),
            "KUMIKI_INSTANCE": f"{name}-local",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if name == "quota":  # the local stack has no identities to check: say so rather than fake one
        env.setdefault("KUMIKI_QUOTA_ALLOW_ANONYMOUS", "true")
    if name == "placement" and "quota" in state.services:  # admission through the stack's quota service
        env.setdefault("KUMIKI_QUOTA_ADDRESS", f"127.0.0.1:{state.services['quota']['grpc_port']}")
    if name == "placement":  # jobs quota held back are asked again every 0.1 s: the replay runs at 1000x and more
        env.setdefault("KUMIKI_PLACEMENT_CYCLE_S", "0.1")
        env.setdefault("KUMIKI_PLACEMENT_IDLE_RECLAIM", LOCAL_IDLE_RECLAIM)
    if name == "preemption" and "placement" in state.services:  # the coordinator releases the jobs it evicts
        env.setdefault("KUMIKI_PLACEMENT_ADDRESS", f"127.0.0.1:{state.services['placement']['grpc_port']}")
    if name == "binder":  # the stack's API server (kumiki.devstack.kube) and placement
        env["KUMIKI_KUBECONFIG"] = str(state.home / "kube" / "kubeconfig")
        env.setdefault("KUMIKI_PLACEMENT_ADDRESS", f"127.0.0.1:{state.services['placement']['grpc_port']}")
    if state.tls:  # `up --tls`: every gRPC server requires a client certificate from the development CA
        from kumiki.devstack.tls import DevelopmentCA, service_tls_env

        env.update(service_tls_env(DevelopmentCA.load(Path(state.tls["folder"])), name))
        if name == "quota":  # placement admits for callers it has checked itself: its Admits skip owner checks
            env.setdefault("KUMIKI_QUOTA_DELEGATES", "placement")
        if name == "binder":  # the binder's own variables for its Placement client
            env.update(
                KUMIKI_PLACEMENT_CAFILE=env["KUMIKI_GRPC_CAFILE"],
                KUMIKI_PLACEMENT_CERTFILE=env["KUMIKI_GRPC_CERTFILE"],
                KUMIKI_PLACEMENT_KEYFILE=env["KUMIKI_GRPC_KEYFILE"],
            )
    if not state.broker.get("idempotent", True):
        env["KUMIKI_KAFKA_IDEMPOTENT"] = "false"
    from kumiki.devstack.observability import observability_state

    running = observability_state(state.home / "observability")  # `kumiki up --observability`: spans to Jaeger
    if running is not None:
        env.setdefault("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{running['jaeger']['otlp_grpc_port']}")
    return env


def _spawn_service(state: StackState, name: str, info: dict[str, Any]) -> None:
    """Start a service as `info` says (module, ports, log, environment overrides) and record it with its pid."""
    env = launch_env(state, name, info["grpc_port"], info["http_port"])
    env.update(info["env"])
    info["pid"] = spawn([sys.executable, "-m", info["module"]], Path(info["log"]), env=env)
    state.services[name] = info
    state.save()


# How often one start may move a service whose port was taken before it could listen (each move: fresh ports).
PORT_MOVES = 3


def _await_listening(state: StackState, name: str, deadline: float, progress: Any = None) -> None:
    """Wait until the service holds its gRPC port (its /readyz names the port from the moment it is bound).

    A port checked free before the start can be taken meanwhile: 50051-50055 lie in Linux's ephemeral range, so
    an outgoing connection may get one as its source port (a clean-clone CI run saw it once). The service then
    exits with EXIT_PORT_IN_USE; it is moved to free ports below that range and started again, and so is every
    running service that was given its address."""
    info = state.services[name]
    for _ in range(PORT_MOVES + 1):
        while not readiness(info["http_port"], timeout=1.0)[1].get("grpc_port"):
            if not alive(info["pid"]):
                break
            if time.monotonic() > deadline:
                raise StackError(f"{name} did not listen on 127.0.0.1:{info['grpc_port']} in time; see {info['log']}")
            time.sleep(0.1)
        else:
            return
        if exit_status(info["pid"]) != EXIT_PORT_IN_USE:
            raise StackError(f"{name} exited during start-up; see {info['log']}")
        address = f"127.0.0.1:{info['grpc_port']}"
        readers = [
            other
            for other, held in state.services.items()
            if other != name
            and alive(held.get("pid"))
            and address in launch_env(state, other, held["grpc_port"], held["http_port"]).values()
        ]
        taken = f"{info['grpc_port']}/{info['http_port']}"
        info["grpc_port"], info["http_port"] = free_port(), free_port()
        if progress is not None:
            progress(f"{name}: port {taken} was taken before it could listen; moved to {info['grpc_port']}")
        _spawn_service(state, name, info)
        for reader in readers:  # started with the old address: again, with the new one
            terminate(state.services[reader]["pid"])
            _spawn_service(state, reader, state.services[reader])
            _await_listening(state, reader, deadline, progress)
    raise StackError(f"{name}: its ports were taken {PORT_MOVES + 1} times before it could listen; see {info['log']}")


def _set_targets(state: StackState) -> None:
    """Prometheus's scrape targets (`up --observability`): every service's HTTP port."""
    from kumiki.devstack.observability import set_targets

    targets = {name: [f"127.0.0.1:{info['http_port']}"] for name, info in state.services.items()}
    set_targets(state.home / "observability", targets)


def readiness(http_port: int, timeout: float = 2.0) -> tuple[str, dict[str, Any]]:
    """('ready' | 'not ready' | 'down', body) from a service's /readyz."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=timeout) as response:
            return "ready", json.loads(response.read())
    except urllib.error.HTTPError as error:
        return "not ready", json.loads(error.read() or b"{}")
    except (OSError, ValueError):
        return "down", {}


def bring_up(
    broker_kind: str,
    database_kind: str,
    *,
    infra_only: bool = False,
    kafka_port: int | None = None,
    postgres_port: int | None = None,
    timeout_s: float = 120.0,
    progress: Any = None,
    kubernetes: bool = False,
    observability: bool = False,
    service_env: Mapping[str, Mapping[str, str]] | None = None,
    tls: bool = False,
    default_ports: bool = True,
) -> StackState:
    """Start what is not running yet; `service_env`: environment overrides per service (kept in stack.json, so a
    restart keeps them); `default_ports=False`: every service on free ports below the ephemeral range (a stack
    whose services are killed and restarted on their ports, as the fault run does)."""
    home = stack_home()
    state = StackState.load(home)
    logs = home / "logs"

    def step(message: str) -> None:
        if progress is not None:
            progress(message)

    external_kafka = os.environ.get("KUMIKI_KAFKA_BOOTSTRAP")
    if external_kafka:
        state.broker = {
            "kind": "external",
            "pid": None,
            "bootstrap": external_kafka,
            "label": "configured (KUMIKI_KAFKA_BOOTSTRAP)",
        }
    elif not (
        state.broker
        and state.broker.get("pid")
        and alive(state.broker["pid"])
        and state.broker.get("kind") == broker_kind
    ):
        if state.broker and state.broker.get("pid") and alive(state.broker["pid"]):
            raise StackError(f"a {state.broker['kind']} broker is already running; `kumiki down` first to switch")
        port = kafka_port or 9092
        if port_open("127.0.0.1", port):
            raise StackError(f"--kafka-port: 127.0.0.1:{port} is already in use; choose another port")
        step(f"starting broker ({broker_kind})")
        state.broker = start_broker(broker_kind, home / f"broker-{broker_kind}", port, logs / "broker.log").as_dict()
        state.save()

    external_db = os.environ.get("KUMIKI_DATABASE_URL")
    if external_db:
        state.database = {
            "kind": "external",
            "pid": None,
            "url": external_db,
            "label": "configured (KUMIKI_DATABASE_URL)",
        }
    elif not (state.database and state.database.get("pid") and alive(state.database["pid"])):
        port = postgres_port or 55432
        if port_open("127.0.0.1", port):
            raise StackError(f"--postgres-port: 127.0.0.1:{port} is already in use; choose another port")
        step(f"starting Postgres ({database_kind})")
        state.database = start_postgres(
            database_kind, home / f"postgres-{database_kind}", port, logs / "postgres.log"
        ).as_dict()
        state.save()
    state.save()
    if infra_only:
        return state

    services = dict(SERVICES)
    if tls and not state.tls:
        running = sorted(name for name, info in state.services.items() if alive(info.get("pid")))
        if running:
            raise StackError(f"--tls: {', '.join(running)} already run without TLS; `kumiki down` first")
        from kumiki.devstack.tls import DevelopmentCA

        step("generating a development CA and certificates (mTLS)")
        ca = DevelopmentCA.load_or_create(home / "tls")
        for name in (*services, "binder", CLI_IDENTITY):
            ca.issue(name)
        state.tls = {"folder": str(ca.folder), "client": CLI_IDENTITY}
        state.save()
    if kubernetes:  # etcd, kube-apiserver and KWOK (built by infra/kube/build.sh when missing), then the binder
        from kumiki.devstack.kube import install_crds, kube_running, start_kube

        kube = kube_running(home / "kube")
        if kube is None:
            step("starting Kubernetes: etcd, kube-apiserver, KWOK (the first run builds them, ~12 min)")
            kube = start_kube(home / "kube", build=True)
        install_crds(kube)  # the PodGroup CRD, before the binder looks for it
        services["binder"] = "kumiki.binder"
    if observability:  # Jaeger and Prometheus first, so services export spans from their first call
        from kumiki.devstack.observability import start_observability

        step("starting Jaeger and Prometheus")
        start_observability(home / "observability", logs, progress=step)
    deadline = time.monotonic() + timeout_s
    for name, module in services.items():
        current = state.services.get(name)
        if current and alive(current.get("pid")):
            continue
        grpc_port, http_port = (
            port if default_ports and can_bind(port) else free_port() for port in DEFAULT_PORTS[name]
        )
        step(f"starting {name}")
        base_env = dict((service_env or {}).get(name, {}))
        where = {"grpc_port": grpc_port, "http_port": http_port, "log": str(logs / f"{name}.log"), "module": module}
        _spawn_service(state, name, {**where, "base_env": base_env, "env": base_env})
        # one at a time, each holding its gRPC port before the next starts: the next may be given its address
        _await_listening(state, name, deadline, step)
    _set_targets(state)
    pending = set(state.services)
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            info = state.services[name]
            if not alive(info["pid"]):
                raise StackError(f"{name} exited during start-up; see {info['log']}")
            if readiness(info["http_port"])[0] == "ready":
                pending.discard(name)
                step(f"{name} ready")
        time.sleep(0.3)
    if pending:
        raise StackError(f"not ready within {timeout_s:.0f}s: {', '.join(sorted(pending))}; see {logs}")
    return state


def restart_service(name: str, overrides: dict[str, str], *, timeout_s: float = 240.0) -> dict[str, str]:
    """Stop one local service and start it again on the same ports with environment overrides (the replay's
    baseline runs placement with another policy), waiting until it is ready again. Returns the gRPC addresses
    that moved (old -> new): a port taken before the service could listen moves it (`_await_listening`)."""
    home = stack_home()
    state = StackState.load(home)
    info = state.services.get(name)
    if info is None:
        raise StackError(f"{name} is not part of the local stack at {home}")
    before = {other: f"127.0.0.1:{held['grpc_port']}" for other, held in state.services.items()}
    terminate(info.get("pid"))
    info["env"] = {**info.get("base_env", {}), **overrides}  # `up`'s own settings stay unless overridden
    _spawn_service(state, name, info)
    deadline = time.monotonic() + timeout_s
    _await_listening(state, name, deadline)
    _set_targets(state)  # where it listens now, moved or not
    while readiness(info["http_port"])[0] != "ready":
        if not alive(info["pid"]):
            raise StackError(f"{name} exited during its restart; see {info['log']}")
        if time.monotonic() > deadline:
            raise StackError(f"{name} not ready within {timeout_s:.0f}s of its restart; see {info['log']}")
        time.sleep(0.2)
    after = {other: f"127.0.0.1:{held['grpc_port']}" for other, held in state.services.items()}
    return {before[other]: address for other, address in after.items() if before.get(other, address) != address}


def service_env(service: str, home: Path | None = None) -> dict[str, str]:
    """The environment overrides a local service runs with now (`up`'s, and its last restart's)."""
    info = StackState.load(home or stack_home()).services.get(service) or {}
    return dict(info.get("env", {}))


def client_tls(home: Path | None = None) -> dict[str, str]:
    """KUMIKI_GRPC_* for a client of a local stack started with `up --tls` (the CLI's certificate, which
    kumiki.common.grpcutil.client_channel reads); empty for a plaintext stack or none."""
    state = StackState.load(home or stack_home())
    if not state.tls:
        return {}
    from kumiki.devstack.tls import DevelopmentCA, client_tls_env

    return client_tls_env(DevelopmentCA.load(Path(state.tls["folder"])), state.tls.get("client", CLI_IDENTITY))


def service_address(service: str, home: Path | None = None) -> str | None:
    """host:port of a running local service's gRPC server, from stack.json (None when the stack has none)."""
    info = StackState.load(home or stack_home()).services.get(service)
    if not info or not alive(info.get("pid")):
        return None
    return f"127.0.0.1:{info['grpc_port']}"


def local_database_url(home: Path | None = None) -> str | None:
    """The local stack's Postgres URL, when `kumiki up` started (or was pointed at) one."""
    state = StackState.load(home or stack_home())
    return str(state.database["url"]) if state.database else None


def local_bootstrap(home: Path | None = None) -> str | None:
    """The local stack's broker, when `kumiki up` started (or was pointed at) one."""
    state = StackState.load(home or stack_home())
    return str(state.broker["bootstrap"]) if state.broker else None


def status_rows(state: StackState) -> list[dict[str, Any]]:
    rows = []
    if state.broker:
        up = (
            alive(state.broker.get("pid"))
            if state.broker.get("pid")
            else port_open(*_host_port(state.broker["bootstrap"]))
        )
        rows.append(
            {
                "component": "broker",
                "kind": state.broker["label"],
                "address": state.broker["bootstrap"],
                "pid": state.broker.get("pid"),
                "health": "ready" if up else "down",
            }
        )
    if state.database:
        up = alive(state.database.get("pid")) if state.database.get("pid") else True
        rows.append(
            {
                "component": "postgres",
                "kind": state.database["label"],
                "address": state.database["url"].split("@")[-1],
                "pid": state.database.get("pid"),
                "health": "ready" if up else "down",
            }
        )
    from kumiki.devstack.observability import observability_rows

    rows.extend(observability_rows(state.home / "observability"))
    for name, info in state.services.items():
        health = readiness(info["http_port"])[0] if alive(info.get("pid")) else "down"
        rows.append(
            {
                "component": name,
                "kind": info["module"],
                "address": f"grpc :{info['grpc_port']} http :{info['http_port']}",
                "pid": info["pid"],
                "health": health,
            }
        )
    return rows


def _host_port(bootstrap: str) -> tuple[str, int]:
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    return host, int(port)


def bring_down(purge: bool = False, progress: Any = None) -> list[str]:
    """Stop services first (they commit their work), then Postgres and the broker; data stays unless purge."""
    home = stack_home()
    state = StackState.load(home)
    names = list(state.services)
    outcomes = terminate_all([state.services[name].get("pid") for name in names])
    stopped = [name for name, was_running in zip(names, outcomes, strict=True) if was_running]
    if progress:
        for name in names:
            progress(f"stopped {name}")
    state.services = {}
    state.tls = None  # the CA stays in KUMIKI_HOME/tls; the next `up` is plaintext unless --tls again
    from kumiki.devstack.kube import stop_kube_folder

    if stop_kube_folder(home / "kube"):
        stopped.append("kubernetes")
    from kumiki.devstack.observability import stop_observability

    if stop_observability(home / "observability"):
        stopped.append("jaeger and prometheus")
    if state.database and state.database.get("pid"):
        if alive(state.database["pid"]):
            stop_postgres(
                Path(state.database["data_dir"]), Path(state.database["bin_dir"]), state.database.get("run_as")
            )
            stopped.append("postgres")
        state.database = None
    if state.broker and state.broker.get("pid"):
        if terminate(state.broker["pid"], timeout_s=30):
            stopped.append("broker")
        state.broker = None
    state.save()
    if purge:
        shutil.rmtree(home, ignore_errors=True)
    return stopped
