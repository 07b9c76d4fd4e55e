"""Apache Kafka that requires SASL_SSL with SCRAM-SHA-512, for real: certificates from a test CA generated here
(kumiki.devstack.tls), users created with Kafka's own tools (kafka-storage format --add-scram before the start,
kafka-configs on the running broker). Every service and the node agent connect with credentials from files
(KUMIKI_KAFKA_SASL_PASSWORD_FILE, KUMIKI_KAFKA_SSL_CAFILE); a wrong password or an unknown CA stops the process
at start with one clear line naming the variable, and no traceback."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kumiki.agent.adapters.jsonl import INVENTORY_FILE, SAMPLES_FILE
from kumiki.agent.core import inventory_to_dict, sample_to_dict
from kumiki.agent.dcgm_core import read_exporter_page
from kumiki.common.config import KafkaSettings
from kumiki.devstack.broker import SecureListener, add_scram_user, kafka_cache_dir, start_kafka_secure
from kumiki.devstack.processes import StackError, free_port, terminate
from kumiki.devstack.tls import DevelopmentCA
from tests.conftest import REPO_ROOT, read_records

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.slow]
SERVICES = {
    "placement": "kumiki.placement",
    "forecast": "kumiki.forecast",
    "quota": "kumiki.quota",
    "preemption": "kumiki.preemption",
    "telemetry-ingest": "kumiki.telemetry",
}


@dataclass
class SecureBroker:
    bootstrap: str
    ca: DevelopmentCA
    folder: Path
    passwords: dict[str, Path]  # user -> a file holding the password (0600)

    def env(self, user: str, *, password_file: Path | None = None, cafile: Path | None = None) -> dict[str, str]:
        return {
            "KUMIKI_KAFKA_BOOTSTRAP": self.bootstrap,
            "KUMIKI_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KUMIKI_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KUMIKI_KAFKA_SASL_USERNAME": user,
            "KUMIKI_KAFKA_SASL_PASSWORD_FILE": str(password_file or self.passwords[user]),
            "KUMIKI_KAFKA_SSL_CAFILE": str(cafile or self.ca.cafile),
        }

    def settings(self, user: str, prefix: str) -> KafkaSettings:
        return KafkaSettings(
            bootstrap=self.bootstrap,
            topic_prefix=prefix,
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=user,
            sasl_password=self.passwords[user].read_text(),
            ssl_cafile=self.ca.cafile,
        )


def _secret_file(folder: Path, name: str, value: str) -> Path:
    path = folder / f"{name}.password"
    path.write_text(value)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    if shutil.which("java") is None or (not (kafka_cache_dir() / "lib").exists() and shutil.which("mvn") is None):
        pytest.skip("Apache Kafka needs java and its jars (CI has both)")
    folder = tmp_path_factory.mktemp("sasl")
    ca = DevelopmentCA.create(folder / "ca", common_name="Kumiki test CA")
    server = ca.issue("kafka")
    users = {name: secrets.token_urlsafe(18) for name in ("admin", "kumiki-services")}
    secure = SecureListener(server.bundle, ca.cafile, "admin", users)
    try:
        broker = start_kafka_secure(folder / "data", free_port(), folder / "kafka.log", secure)
    except StackError as error:
        pytest.skip(f"Apache Kafka did not start: {error}")
    try:
        agent_password = secrets.token_urlsafe(18)
        add_scram_user(broker.bootstrap, secure, "kumiki-agent", agent_password, folder)  # kafka-configs
        passwords = {name: _secret_file(folder, name, value) for name, value in users.items()}
        passwords["kumiki-agent"] = _secret_file(folder, "kumiki-agent", agent_password)
        yield SecureBroker(broker.bootstrap, ca, folder, passwords)
    finally:
        terminate(broker.pid)


def _ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _process_env(extra: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")}
    return {**base, "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}", **extra}


@pytest.fixture
def database_url(postgres_admin_url: str) -> Iterator[str]:
    """A fresh database for the services of one test (they share it, each in its own schema, as in a stack)."""
    import asyncio

    import asyncpg

    name = f"sasl_{uuid.uuid4().hex[:10]}"

    async def admin(statement: str) -> None:
        connection = await asyncpg.connect(postgres_admin_url)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    yield f"{postgres_admin_url.rpartition('/')[0]}/{name}"
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def test_every_service_and_the_agent_connect_with_credentials_from_files(
    secure_broker: SecureBroker, database_url: str, tmp_path: Path
) -> None:
    prefix = f"sasl-{uuid.uuid4().hex[:8]}."
    queues = tmp_path / "queues.yaml"
    queues.write_text(json.dumps({"cluster": {"gpus": {"A100": 8}}, "queues": [{"name": "team-a"}]}))
    processes: dict[str, tuple[subprocess.Popen[bytes], int, Path]] = {}
    try:
        for name, module in SERVICES.items():
            http_port = free_port()
            prefix_var = "KUMIKI_" + name.upper().replace("-", "_")
            env = _process_env(
                {
                    **secure_broker.env("kumiki-services"),
                    "KUMIKI_TOPIC_PREFIX": prefix,
                    "KUMIKI_DATABASE_URL": database_url,
                    f"{prefix_var}_GRPC_PORT": str(free_port()),
                    f"{prefix_var}_HTTP_PORT": str(http_port),
                    "KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true",
                    "KUMIKI_QUOTA_CONFIG_FILE": str(queues),
                }
            )
            log = tmp_path / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen([sys.executable, "-m", module], env=env, stdout=out, stderr=out)
            processes[name] = (process, http_port, log)
        deadline = time.monotonic() + 240
        waiting = set(processes)
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                process, http_port, log = processes[name]
                assert process.poll() is None, f"{name} exited: {log.read_text()[-2000:]}"
                if _ready(http_port):
                    waiting.discard(name)
            time.sleep(0.5)
        assert not waiting, f"not ready over SASL_SSL: {sorted(waiting)}"

        # the agent, as its own SCRAM user (created by kafka-configs), replays a DCGM page's samples
        page = (REPO_ROOT / "tests" / "agent" / "fixtures" / "dcgm_exporter_a100_mig.prom").read_text()
        reading = read_exporter_page(page, None, time.time())
        recording = tmp_path / "recording"
        recording.mkdir()
        (recording / INVENTORY_FILE).write_text(json.dumps(inventory_to_dict(reading.inventory)))
        (recording / SAMPLES_FILE).write_text("".join(json.dumps(sample_to_dict(s)) + "\n" for s in reading.samples))
        agent = subprocess.run(
            [sys.executable, "-m", "kumiki.agent", "--node", "gpu-node-7", "--replay", str(recording), "--speed", "0",
             "--output", "kafka"],
            env=_process_env({**secure_broker.env("kumiki-agent"), "KUMIKI_TOPIC_PREFIX": prefix}),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-2000:]
        import asyncio

        records = asyncio.run(
            read_records(
                secure_broker.settings("kumiki-services", prefix), f"{prefix}gpu.samples", len(reading.samples)
            )
        )
        assert len(records) >= len(reading.samples)
    finally:
        for process, _, _ in processes.values():
            process.terminate()
        for process, _, _ in processes.values():
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()


def _informational(line: str) -> bool:
    """A service's JSON log line or the agent's text log line below WARNING: not the error line."""
    if line.startswith("{"):
        return json.loads(line).get("level") in ("DEBUG", "INFO")
    return re.match(r"^\d{4}-\d\d-\d\d [\d:,]+ (DEBUG|INFO) ", line) is not None


def _start_fails(argv: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    result = subprocess.run(argv, env=_process_env(env), capture_output=True, text=True, timeout=120)
    return result.returncode, [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("who", ["placement", "agent"])
def test_a_wrong_password_fails_at_start_with_one_clear_line(
    secure_broker: SecureBroker, tmp_path: Path, who: str
) -> None:
    wrong = _secret_file(tmp_path, "wrong", "not-the-password")
    user = "kumiki-agent" if who == "agent" else "kumiki-services"
    env = {**secure_broker.env(user, password_file=wrong), "KUMIKI_TOPIC_PREFIX": "sasl-wrong."}
    argv = [sys.executable, "-m", "kumiki.placement"]
    if who == "agent":
        (tmp_path / "rec").mkdir()
        argv = [sys.executable, "-m", "kumiki.agent", "--node", "n1", "--replay", str(tmp_path / "rec"), "--output",
                "kafka"]  # fmt: skip
    else:
        env["KUMIKI_PLACEMENT_GRPC_PORT"], env["KUMIKI_PLACEMENT_HTTP_PORT"] = str(free_port()), str(free_port())
    code, lines = _start_fails(argv, env)
    assert code == 3, lines
    assert not any("Traceback" in line for line in lines), lines
    plain = [line for line in lines if not _informational(line)]
    assert plain == [
        f"{'python -m kumiki.agent' if who == 'agent' else 'kumiki-placement'}: KUMIKI_KAFKA_SASL_PASSWORD: the broker"
        f" at {secure_broker.bootstrap} refused user '{user}' (SCRAM-SHA-512): wrong password or unknown user"
    ], lines


def test_an_unknown_ca_fails_at_start_with_one_clear_line(secure_broker: SecureBroker, tmp_path: Path) -> None:
    other = DevelopmentCA.create(tmp_path / "other", common_name="Not the broker's CA")
    env = {
        **secure_broker.env("kumiki-services", cafile=other.cafile),
        "KUMIKI_TOPIC_PREFIX": "sasl-ca.",
        "KUMIKI_PLACEMENT_GRPC_PORT": str(free_port()),
        "KUMIKI_PLACEMENT_HTTP_PORT": str(free_port()),
    }
    code, lines = _start_fails([sys.executable, "-m", "kumiki.placement"], env)
    assert code == 3, lines
    assert not any("Traceback" in line for line in lines), lines
    plain = [line for line in lines if not _informational(line)]
    assert plain == [
        f"kumiki-placement: KUMIKI_KAFKA_SSL_CAFILE: the broker at {secure_broker.bootstrap} presented a certificate"
        f" that the CA in '{other.cafile}' did not sign (unable to get local issuer certificate)"
    ], lines
