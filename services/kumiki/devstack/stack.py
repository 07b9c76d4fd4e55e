"""`kumiki up`, `status`, `down`: the whole stack as local processes, with its state in KUMIKI_HOME/stack.json."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kumiki.devstack.broker import start_broker
from kumiki.devstack.postgres import start_postgres, stop_postgres
from kumiki.devstack.processes import StackError, alive, free_port, port_open, spawn, terminate

# service name -> python module that runs it
SERVICES: dict[str, str] = {
    "telemetry-ingest": "kumiki.telemetry",
    "forecast": "kumiki.forecast",
    "placement": "kumiki.placement",
    "preemption": "kumiki.preemption",
    "quota": "kumiki.quota",
}


def stack_home() -> Path:
    return Path(os.environ.get("KUMIKI_HOME", Path.cwd() / ".kumiki")).resolve()


@dataclass
class StackState:
    home: Path
    broker: dict[str, Any] | None = None
    database: dict[str, Any] | None = None
    services: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.home / "stack.json"

    @classmethod
    def load(cls, home: Path) -> StackState:
        path = home / "stack.json"
        if not path.exists():
            return cls(home)
        data = json.loads(path.read_text())
        return cls(home, data.get("broker"), data.get("database"), data.get("services", {}))

    def save(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        payload = {"broker": self.broker, "database": self.database, "services": self.services}
        self.path.write_text(json.dumps(payload, indent=2))


def _service_env(state: StackState, name: str, grpc_port: int, http_port: int) -> dict[str, str]:
    env = dict(os.environ)
    prefix = "KUMIKI_" + name.upper().replace("-", "_")
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
    if not state.broker.get("idempotent", True):
        env["KUMIKI_KAFKA_IDEMPOTENT"] = "false"
    return env


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
) -> StackState:
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

    for name, module in SERVICES.items():
        current = state.services.get(name)
        if current and alive(current.get("pid")):
            continue
        grpc_port, http_port = free_port(), free_port()
        step(f"starting {name}")
        pid = spawn(
            [sys.executable, "-m", module], logs / f"{name}.log", env=_service_env(state, name, grpc_port, http_port)
        )
        state.services[name] = {
            "pid": pid,
            "grpc_port": grpc_port,
            "http_port": http_port,
            "log": str(logs / f"{name}.log"),
            "module": module,
        }
        state.save()

    deadline = time.monotonic() + timeout_s
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
    stopped = []
    for name, info in list(state.services.items()):
        if terminate(info.get("pid")):
            stopped.append(name)
        if progress:
            progress(f"stopped {name}")
    state.services = {}
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
