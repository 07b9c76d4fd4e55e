"""A real Apache Kafka with SASL_SSL + SCRAM-SHA-512 (and, for the ACL tests, an authorizer), and the five
services started on it as processes, each with credentials from files: shared by test_kafka_sasl and
test_kafka_acls."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from kumiki.agent.adapters.jsonl import INVENTORY_FILE, SAMPLES_FILE
from kumiki.agent.core import inventory_to_dict, sample_to_dict
from kumiki.agent.dcgm_core import read_exporter_page
from kumiki.common.config import KafkaSettings
from kumiki.devstack.broker import SecureListener, kafka_cache_dir, start_kafka_secure
from kumiki.devstack.processes import StackError, free_port, terminate
from kumiki.devstack.tls import DevelopmentCA
from tests.conftest import REPO_ROOT

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
    listener: SecureListener | None = None  # what adding users on the running broker needs (kafka-configs)

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


def secret_file(folder: Path, name: str, value: str) -> Path:
    path = folder / f"{name}.password"
    path.write_text(value)
    path.chmod(0o600)
    return path


@contextmanager
def secure_kafka(
    folder: Path, users: list[str], *, authorizer: bool = False
) -> Iterator[tuple[SecureBroker, SecureListener]]:
    """Apache Kafka whose only client listener is SASL_SSL, with `admin` and `users` created at format time
    (random passwords, each in a 0600 file); skips where Java or the jars are missing."""
    if shutil.which("java") is None or (not (kafka_cache_dir() / "lib").exists() and shutil.which("mvn") is None):
        pytest.skip("Apache Kafka needs java and its jars (CI has both)")
    ca = DevelopmentCA.create(folder / "ca", common_name="Kumiki test CA")
    server = ca.issue("kafka")
    passwords = {name: secrets.token_urlsafe(18) for name in ("admin", *users)}
    secure = SecureListener(server.bundle, ca.cafile, "admin", passwords, authorizer=authorizer)
    try:
        broker = start_kafka_secure(folder / "data", free_port(), folder / "kafka.log", secure)
    except StackError as error:
        pytest.skip(f"Apache Kafka did not start: {error}")
    try:
        files = {name: secret_file(folder, name, value) for name, value in passwords.items()}
        yield SecureBroker(broker.bootstrap, ca, folder, files, secure), secure
    finally:
        terminate(broker.pid)


def ready(http_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def process_env(extra: Mapping[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")}
    return {**base, "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}", **extra}


@dataclass
class RunningService:
    process: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    log: Path


@contextmanager
def services_running(env_of: Mapping[str, Mapping[str, str]], folder: Path) -> Iterator[dict[str, RunningService]]:
    """Start each service (name -> its environment; its gRPC port where the environment names one) as a process
    and wait until every one is ready; a service that exits first fails the test with its log's tail."""
    running: dict[str, RunningService] = {}
    try:
        for name, extra in env_of.items():
            prefix_var = "KUMIKI_" + name.upper().replace("-", "_")
            grpc_port = int(extra.get(f"{prefix_var}_GRPC_PORT") or free_port())  # one another service calls
            http_port = free_port()
            env = process_env(
                {**extra, f"{prefix_var}_GRPC_PORT": str(grpc_port), f"{prefix_var}_HTTP_PORT": str(http_port)}
            )
            log = folder / f"{name}.log"
            with log.open("wb") as out:
                process = subprocess.Popen([sys.executable, "-m", SERVICES[name]], env=env, stdout=out, stderr=out)
            running[name] = RunningService(process, grpc_port, http_port, log)
        deadline = time.monotonic() + 240
        waiting = set(running)
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                service = running[name]
                assert service.process.poll() is None, f"{name} exited: {service.log.read_text()[-2000:]}"
                if ready(service.http_port):
                    waiting.discard(name)
            time.sleep(0.5)
        assert not waiting, f"not ready: {sorted(waiting)}: {[running[n].log.read_text()[-1500:] for n in waiting]}"
        yield running
    finally:
        for service in running.values():
            service.process.terminate()
        for service in running.values():
            try:
                service.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                service.process.kill()


def record_dcgm_page(folder: Path) -> tuple[Path, int]:
    """An agent recording (inventory and samples) of a real DCGM exporter page for node gpu-node-7; returns the
    folder and the number of samples."""
    page = (REPO_ROOT / "tests" / "agent" / "fixtures" / "dcgm_exporter_a100_mig.prom").read_text()
    reading = read_exporter_page(page, None, time.time())
    recording = folder / "recording"
    recording.mkdir()
    (recording / INVENTORY_FILE).write_text(json.dumps(inventory_to_dict(reading.inventory)))
    (recording / SAMPLES_FILE).write_text("".join(json.dumps(sample_to_dict(s)) + "\n" for s in reading.samples))
    return recording, len(reading.samples)


def run_agent(recording: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kumiki.agent", "--node", "gpu-node-7", "--replay", str(recording), "--speed", "0",
         "--output", "kafka"],
        env=process_env(env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
