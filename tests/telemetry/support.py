"""Telemetry test helpers: node agents on the fake libnvidia-ml.so.1, the telemetry service as a process, and
what it publishes, read back from the broker (fixtures in conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiokafka import AIOKafkaConsumer

from kumiki.common.bus.topics import CLUSTER_STATE, DEAD_LETTER, GPU_BUSY, GPU_IDLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from tests.agent.fake_nvml.build import FakeNvmlConfig
from tests.conftest import REPO_ROOT

GIB = 1024**3
IDLE_GPU, BUSY_GPU, OTHER_GPU = "GPU-a0-idle", "GPU-a1-busy", "GPU-b0"


def node_a() -> FakeNvmlConfig:
    return FakeNvmlConfig(
        system={"driver_version": "550.54.15", "cuda_version": 12040},
        gpus=[
            {
                "uuid": IDLE_GPU,
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_total": 80 * GIB,
                "memory_used": 2 * GIB,
                "util_gpu": [1, 3, 2],
                "mig": "off",
                "nvlink_count": 12,
            },
            {
                "uuid": BUSY_GPU,
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_total": 80 * GIB,
                "memory_used": 60 * GIB,
                "util_gpu": [88, 97, 92],
                "mig": "off",
                "nvlink_count": 12,
            },
        ],
        nvlinks=[{"a": 0, "b": 1, "links": 12}],
        topology=[{"a": 0, "b": 1, "level": "SINGLE"}],
    )


def node_b() -> FakeNvmlConfig:
    return FakeNvmlConfig(
        gpus=[
            {
                "uuid": OTHER_GPU,
                "name": "NVIDIA L4",
                "memory_total": 24 * GIB,
                "memory_used": 0,
                "util_gpu": [50],
                "mig": "off",
                "nvlink_count": 0,
            }
        ]
    )


class Topics:
    """Everything on the output topics so far (a consumer without a group, from the beginning)."""

    def __init__(self, settings: KafkaSettings) -> None:
        names = [spec.full_name(settings.topic_prefix) for spec in (CLUSTER_STATE, GPU_IDLE, GPU_BUSY, DEAD_LETTER)]
        self.states: list[events_pb2.NodeState] = []
        self.idle: list[events_pb2.GpuIdle] = []
        self.busy: list[events_pb2.GpuBusy] = []
        self.dead: list[dict[str, bytes]] = []
        self.dead_values: list[bytes | None] = []
        self._names = dict(zip(names, ("states", "idle", "busy", "dead"), strict=True))
        self._consumer = AIOKafkaConsumer(
            *names, bootstrap_servers=settings.bootstrap, auto_offset_reset="earliest", group_id=None
        )

    async def poll(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=100)
        for partition, records in batches.items():
            kind = self._names[partition.topic]
            for record in records:
                if kind == "states":
                    self.states.append(events_pb2.NodeState.FromString(record.value))
                elif kind == "idle":
                    self.idle.append(events_pb2.GpuIdle.FromString(record.value))
                elif kind == "busy":
                    self.busy.append(events_pb2.GpuBusy.FromString(record.value))
                else:
                    self.dead.append(dict(record.headers))
                    self.dead_values.append(record.value)

    def latest(self, node: str) -> events_pb2.NodeState | None:
        matching = [state for state in self.states if state.node == node]
        return matching[-1] if matching else None


def service_env(settings: KafkaSettings, http_port: int) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}",
        "KUMIKI_KAFKA_BOOTSTRAP": settings.bootstrap,
        "KUMIKI_TOPIC_PREFIX": settings.topic_prefix,
        "KUMIKI_TELEMETRY_INGEST_HTTP_PORT": str(http_port),
        "KUMIKI_TELEMETRY_INGEST_GRPC_PORT": "0",
        "KUMIKI_TELEMETRY_GPU_WINDOW_S": "10",
        "KUMIKI_TELEMETRY_USAGE_WINDOW_S": "10",
        "KUMIKI_TELEMETRY_USAGE_STEP_S": "10",
        "KUMIKI_TELEMETRY_NODE_TIMEOUT_S": "2",
        "KUMIKI_TELEMETRY_PUBLISH_INTERVAL_S": "0.5",
        "KUMIKI_TELEMETRY_IDLE": "default=10:1.5",
        "KUMIKI_TELEMETRY_SESSION_TIMEOUT_S": "6",
        "KUMIKI_LOG_LEVEL": "WARNING",
    }


class Processes:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.tmp_path / f"{name}.log").open("ab") as log:
            process = subprocess.Popen([sys.executable, *argv], env=env, stdout=log, stderr=subprocess.STDOUT)
        self.running[name] = process
        return process

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        process = self.running.pop(name)
        process.send_signal(sig)
        process.wait(timeout=30)

    def log(self, name: str) -> str:
        return (self.tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]


async def ready(port: int) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as reply:
            return reply.status == 200
    except aiohttp.ClientError:
        return False
