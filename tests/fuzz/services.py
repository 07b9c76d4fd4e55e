"""Every gRPC service of Kumiki started in-process by the shared shell (ServiceHost, the same server setup as
production: the request guard, tracing, health), on loopback, over the real Apache Kafka and Postgres.

Each service runs on its own event loop in its own background thread, as each runs in its own process in a
stack: a plain (synchronous) hypothesis test or the benchmark calls them with a blocking gRPC channel, as any
outside client would, and one service's CPU-bound work (forecast refitting on the lifecycle events the fuzzed
binds publish) does not stall another's loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import yaml
from google.protobuf.descriptor import MethodDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kumiki.common.config import DatabaseSettings, KafkaSettings, ServerSettings, Settings
from kumiki.common.contracts.v1 import checkpoints_pb2, forecast_pb2, placement_pb2, quota_pb2
from kumiki.common.service import ServiceHost, ServiceSpec

QUEUES = {
    "cluster": {"gpus": {"A100": 64}},
    "rates": {"A100": 2.0},
    "queues": [
        {"name": "org", "guarantee": 32},
        {"name": "team-a", "parent": "org", "guarantee": 16, "limit": 32},
        {"name": "batch", "parent": "org", "guarantee": 0},
    ],
}
# service name -> the proto services it serves
GRPC_SERVICES: dict[str, Any] = {
    "placement": placement_pb2.DESCRIPTOR.services_by_name["Placement"],
    "forecast": forecast_pb2.DESCRIPTOR.services_by_name["Forecaster"],
    "quota": quota_pb2.DESCRIPTOR.services_by_name["Quota"],
    "preemption": checkpoints_pb2.DESCRIPTOR.services_by_name["Checkpoints"],
}


def service_specs() -> dict[str, ServiceSpec]:
    from kumiki.forecast.app import SPEC as FORECAST
    from kumiki.placement.app import SPEC as PLACEMENT
    from kumiki.preemption.app import SPEC as PREEMPTION
    from kumiki.quota.app import SPEC as QUOTA

    return {"placement": PLACEMENT, "forecast": FORECAST, "quota": QUOTA, "preemption": PREEMPTION}


@dataclass
class Endpoint:
    """One RPC of one service, as an outside client sees it: a path and raw bytes in and out."""

    service: str
    method: MethodDescriptor
    address: str

    @property
    def path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def name(self) -> str:
        return f"{self.method.containing_service.name}.{self.method.name}"

    @property
    def streaming(self) -> bool:
        return bool(self.method.client_streaming)

    @property
    def watching(self) -> bool:
        return bool(self.method.server_streaming and not self.method.client_streaming)


@dataclass
class RunningServices:
    loops: dict[str, asyncio.AbstractEventLoop]
    hosts: dict[str, ServiceHost]
    endpoints: list[Endpoint] = field(default_factory=list)

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.hosts[service].grpc_port}"

    def health(self, service: str) -> int:
        with grpc.insecure_channel(self.address(service)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)


async def _fresh_database(admin_url: str) -> str:
    name = f"fuzz_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return f"{admin_url.rpartition('/')[0]}/{name}"


async def _drop_database(admin_url: str, url: str) -> None:
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{url.rpartition("/")[2]}" WITH (FORCE)')
    finally:
        await admin.close()


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def running_services(
    kafka_bootstrap: str, admin_url: str, folder: Path, services: tuple[str, ...] = tuple(GRPC_SERVICES)
) -> Iterator[RunningServices]:
    """All the named services, started in a background thread's event loop; stopped and their databases dropped
    on exit. Quota runs in anonymous (development) mode so fuzzed requests reach its handlers."""
    (folder / "queues.yaml").write_text(yaml.safe_dump(QUEUES))
    env = {"KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true", "KUMIKI_QUOTA_CONFIG_FILE": str(folder / "queues.yaml")}
    kafka = KafkaSettings(bootstrap=kafka_bootstrap, topic_prefix=f"fuzz-{uuid.uuid4().hex[:10]}.")
    loops = {name: asyncio.new_event_loop() for name in (*services, "admin")}
    threads = [
        threading.Thread(target=loop.run_forever, name=f"fuzz-{name}", daemon=True) for name, loop in loops.items()
    ]
    for thread in threads:
        thread.start()

    def run(coro: Any, timeout: float = 120.0, on: str = "admin") -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, loops[on])
        return future.result(timeout)

    specs = service_specs()
    hosts: dict[str, ServiceHost] = {}
    databases: list[str] = []
    try:
        with _environment(env):
            for name in services:
                spec = specs[name]
                database = DatabaseSettings()
                if spec.schema is not None:
                    url = run(_fresh_database(admin_url))
                    databases.append(url)
                    database = DatabaseSettings(url=url, pool_min=1, pool_max=4)
                settings = Settings(
                    service=name,
                    kafka=kafka,
                    database=database,
                    server=ServerSettings(host="127.0.0.1"),
                    instance=f"{name}-fuzz",
                )
                host = ServiceHost(spec, settings)
                hosts[name] = host
                run(host.start(), on=name)
        running = RunningServices(loops, hosts)
        for name in services:
            for method in GRPC_SERVICES[name].methods:
                running.endpoints.append(Endpoint(name, method, running.address(name)))
        yield running
    finally:
        for name, host in hosts.items():
            try:
                run(host.stop(), on=name)
            except Exception as error:  # stop the others anyway
                logging.getLogger(__name__).warning("stopping a fuzzed service failed: %r", error)
        for url in databases:
            run(_drop_database(admin_url, url))
        for loop in loops.values():
            loop.call_soon_threadsafe(loop.stop)
        for thread in threads:
            thread.join(timeout=10)
        for loop in loops.values():
            loop.close()
