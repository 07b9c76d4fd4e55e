"""A `kumiki up` stack of its own that the fault-injection run may kill: its services, Apache Kafka and Postgres
are killed and started again here, and a supervisor restarts any service that exits, as Kubernetes would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.devstack.broker import start_kafka
from kumiki.devstack.postgres import start_postgres, stop_postgres
from kumiki.devstack.processes import StackError, alive, free_port, spawn, wait_for_port
from kumiki.devstack.stack import StackState, bring_down, bring_up, launch_env, readiness


class PrivateStack:
    """A `kumiki up` stack of its own (Apache Kafka, Postgres, the five services) that the run may kill."""

    def __init__(self, home: Path, database: str) -> None:
        self.home = home
        self.database_kind = database
        self.state = StackState(home)
        self.paused: set[str] = set()
        self.busy: set[str] = set()  # being restarted by a fault: the supervisor leaves them alone
        self.crashes: list[tuple[float, str]] = []  # (monotonic time, service) of exits nobody asked for

    def up(self) -> None:
        os.environ["KUMIKI_HOME"] = str(self.home)
        for name in ("KUMIKI_KAFKA_BOOTSTRAP", "KUMIKI_DATABASE_URL"):  # private infrastructure, never the shared
            os.environ.pop(name, None)
        # free ports below the ephemeral range: a service killed here comes back on its port, which no outgoing
        # connection may take as its source port meanwhile (the defaults 50051-50055 lie in that range)
        self.state = bring_up(
            "kafka",
            self.database_kind,
            kafka_port=free_port(),
            postgres_port=free_port(),
            timeout_s=300.0,
            default_ports=False,
        )

    def down(self) -> None:
        for name in list(self.paused):
            self.signal(name, signal.SIGCONT)
        self.state.save()
        bring_down()

    @property
    def kafka(self) -> KafkaSettings:
        assert self.state.broker is not None
        return KafkaSettings(bootstrap=self.state.broker["bootstrap"])

    @property
    def db(self) -> DatabaseSettings:
        assert self.state.database is not None
        return DatabaseSettings(url=self.state.database["url"])

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.state.services[service]['grpc_port']}"

    def signal(self, service: str, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.state.services[service]["pid"], signum)

    def start(self, service: str) -> None:
        info = self.state.services[service]
        env = launch_env(self.state, service, info["grpc_port"], info["http_port"])
        env.update(info.get("env", {}))  # what `up` or the last restart set for it
        info["pid"] = spawn([sys.executable, "-m", info["module"]], Path(info["log"]), env=env)
        self.state.save()

    def kill(self, service: str) -> None:
        """SIGKILL the service's process group and start it again at once (a crash and the pod's restart)."""
        self.signal(service, signal.SIGKILL)
        wait_dead(self.state.services[service]["pid"])
        self.start(service)

    def restart_kafka(self) -> None:
        assert self.state.broker is not None
        broker = self.state.broker
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(broker["pid"], signal.SIGKILL)
        wait_dead(broker["pid"])
        port = int(broker["bootstrap"].rpartition(":")[2])
        started = Path(broker["log"]).read_text(errors="replace").count("Kafka Server started")
        try:
            self.state.broker = start_kafka(Path(broker["data_dir"]), port, Path(broker["log"])).as_dict()
        except StackError:  # its 90 s are not always enough on a loaded machine (log recovery after a kill)
            pid = broker_pid(Path(broker["data_dir"]))
            if pid is None:
                raise
            self.state.broker = {**broker, "pid": pid}
            wait_for_port("127.0.0.1", port, 300, None, "Apache Kafka", Path(broker["log"]))
        self.state.save()
        deadline = time.monotonic() + 300  # listening is not serving: wait for the broker's own word
        while Path(broker["log"]).read_text(errors="replace").count("Kafka Server started") <= started:
            if time.monotonic() > deadline:
                raise StackError(f"Apache Kafka not started 300 s after its restart; see {broker['log']}")
            time.sleep(0.2)

    def restart_postgres(self) -> None:
        """pg_ctl stop -m immediate (no shutdown checkpoint: crash recovery at the next start), then start."""
        assert self.state.database is not None
        database = self.state.database
        stop_postgres(Path(database["data_dir"]), Path(database["bin_dir"]), database.get("run_as"), mode="immediate")
        port = int(database["url"].rpartition(":")[2].split("/")[0])
        self.state.database = start_postgres(
            self.database_kind, Path(database["data_dir"]), port, Path(database["log"])
        ).as_dict()
        self.state.save()

    def all_ready(self) -> bool:
        return all(
            name not in self.paused and readiness(info["http_port"], timeout=1.0)[0] == "ready"
            for name, info in self.state.services.items()
        )

    def supervise_once(self) -> list[str]:
        """Restart every service whose process is gone (not paused, not being restarted); returns them."""
        restarted = []
        for name, info in self.state.services.items():
            if name in self.paused or name in self.busy or alive(info["pid"]):
                continue
            self.crashes.append((time.monotonic(), name))
            self.start(name)
            restarted.append(name)
        return restarted


def broker_pid(data_dir: Path) -> int | None:
    """The JVM start_kafka spawned for this stack: its command line names this data dir's properties file, so
    no other broker on the machine can match."""
    pattern = f"kafka.Kafka {data_dir / 'server.properties'}"
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return int(found[-1]) if found else None


def wait_dead(pid: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            raise StackError(f"process {pid} still alive {timeout_s:.0f}s after SIGKILL")
        time.sleep(0.05)
