"""The live stack for the observability tests: placement, quota and forecast as processes over Apache Kafka and
Postgres, exporting spans to a real Jaeger (OTLP/gRPC) and serving /metrics for a real Prometheus."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.devstack.observability import JaegerProcess
from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import readiness
from tests.conftest import REPO_ROOT, wait_until

MODULES = {
    "placement": "kumiki.placement",
    "quota": "kumiki.quota",
    "forecast": "kumiki.forecast",
    "preemption": "kumiki.preemption",
    "telemetry-ingest": "kumiki.telemetry",
}
ALL_SERVICES = ("quota", "forecast", "preemption", "telemetry-ingest", "placement")
QUEUES = {
    "cluster": {"gpus": {"A100-80GB": 16, "H100-80GB": 8, "V100-32GB": 8}},
    "rates": {"A100-80GB": 2.0},
    "queues": [
        {"name": "team-a", "guarantee": 24},
        {"name": "team-b", "guarantee": 0, "limit": 4},
    ],
}


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    grpc_port: int
    http_port: int
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"


@dataclass
class LiveStack:
    services: dict[str, Service] = field(default_factory=dict)

    def ready(self) -> bool:
        """All ready; a service that exited fails at once with its log."""
        for service in self.services.values():
            if service.process.poll() is not None:
                raise AssertionError(f"{service.name} exited ({service.process.returncode}): {self.logs()}")
        return all(readiness(service.http_port)[0] == "ready" for service in self.services.values())

    def kill_and_restart(self, name: str) -> None:
        """SIGKILL one service (nothing flushed, nothing handed over) and start it again on the same ports."""
        service = self.services[name]
        service.process.kill()
        service.process.wait()
        with service.log.open("ab") as out:
            service.process = subprocess.Popen(
                [sys.executable, "-m", MODULES[name]], env=service.env, stdout=out, stderr=subprocess.STDOUT
            )

    def logs(self) -> str:
        return "\n".join(f"--- {s.name}\n{s.log.read_text(errors='replace')[-3000:]}" for s in self.services.values())


def service_env(
    name: str,
    kafka: KafkaSettings,
    database: DatabaseSettings,
    grpc_port: int,
    http_port: int,
    extra: Mapping[str, str],
) -> dict[str, str]:
    prefix = "KUMIKI_" + name.upper().replace("-", "_")
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KUMIKI_", "OTEL_"))},
        "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}",
        "PYTHONUNBUFFERED": "1",
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_DATABASE_URL": database.url,
        f"{prefix}_GRPC_PORT": str(grpc_port),
        f"{prefix}_HTTP_PORT": str(http_port),
        "KUMIKI_INSTANCE": f"{name}-test",
        "KUMIKI_LOG_LEVEL": "WARNING",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # spans reach Jaeger within a tenth of a second
        **extra,
    }


@contextmanager
def live_stack(
    kafka: KafkaSettings,
    database: DatabaseSettings,
    folder: Path,
    env: Mapping[str, str] = {},
    names: Sequence[str] = ("quota", "forecast", "placement"),
) -> Iterator[LiveStack]:
    """Start the services (quota first: placement asks it at every bind); stop them with SIGTERM at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    queues = folder / "queues.yaml"
    queues.write_text(yaml.safe_dump(QUEUES))
    ports = {name: (free_port(), free_port()) for name in names}
    stack = LiveStack()
    try:
        for name in names:
            grpc_port, http_port = ports[name]
            extra = dict(env)
            if name == "quota":
                extra |= {"KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true", "KUMIKI_QUOTA_CONFIG_FILE": str(queues)}
            if name == "placement" and "quota" in ports:
                extra["KUMIKI_QUOTA_ADDRESS"] = f"127.0.0.1:{ports['quota'][0]}"
            if name == "preemption" and "placement" in ports:  # the coordinator releases evicted jobs there
                extra["KUMIKI_PLACEMENT_ADDRESS"] = f"127.0.0.1:{ports['placement'][0]}"
            log = folder / f"{name}.log"
            environment = service_env(name, kafka, database, grpc_port, http_port, extra)
            with log.open("wb") as out:
                process = subprocess.Popen(
                    [sys.executable, "-m", MODULES[name]], env=environment, stdout=out, stderr=subprocess.STDOUT
                )
            stack.services[name] = Service(name, process, grpc_port, http_port, log, environment)
        yield stack
    finally:
        for service in stack.services.values():
            if service.process.poll() is None:
                service.process.send_signal(signal.SIGTERM)
        for service in stack.services.values():
            try:
                service.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                service.process.kill()
                service.process.wait()


def prometheus_query(url: str, query: str) -> list[dict[str, Any]]:
    """An instant query's result vector (`/api/v1/query`)."""
    body = get_json(f"{url}/api/v1/query", {"query": query})
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def get_json(url: str, params: Mapping[str, str] | None = None, timeout: float = 5.0) -> Any:
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def jaeger_trace(query_url: str, trace_id: int) -> dict[str, Any] | None:
    """One trace from Jaeger's query API (`/api/traces/{id}`), or None while Jaeger does not have it."""
    try:
        body = get_json(f"{query_url}/api/traces/{trace_id:032x}")
    except OSError:
        return None
    data = body.get("data") or []
    return data[0] if data else None


class Tree:
    """A Jaeger trace as spans by id, with their service, kind, tags and parent."""

    def __init__(self, data: dict[str, Any]) -> None:
        processes = {key: value["serviceName"] for key, value in data["processes"].items()}
        self.spans: dict[str, dict[str, Any]] = {}
        for span in data["spans"]:
            parents = [ref["spanID"] for ref in span.get("references", []) if ref["refType"] == "CHILD_OF"]
            tags = {tag["key"]: tag["value"] for tag in span.get("tags", [])}
            self.spans[span["spanID"]] = {
                "name": span["operationName"],
                "service": processes[span["processID"]],
                "kind": tags.get("span.kind", "internal"),
                "tags": tags,
                "parent": parents[0] if parents else None,
                "start": span["startTime"],
                "duration": span["duration"],
            }

    def find(self, name: str, service: str, parent: str | None = None, **tags: object) -> str:
        """The one span with this name and service (and parent, and tags); fails listing what there is."""
        found = [
            span_id
            for span_id, span in self.spans.items()
            if span["name"] == name
            and span["service"] == service
            and (parent is None or span["parent"] == parent)
            and all(span["tags"].get(key) == value for key, value in tags.items())
        ]
        assert len(found) == 1, f"{name} in {service} under {parent}: {len(found)} spans; trace: {self.describe()}"
        return found[0]

    def tags(self, span_id: str) -> dict[str, Any]:
        return dict(self.spans[span_id]["tags"])

    def has(self, name_prefix: str, service: str) -> bool:
        return any(s["name"].startswith(name_prefix) and s["service"] == service for s in self.spans.values())

    def describe(self) -> str:
        return "; ".join(
            f"{s['service']}:{s['name']}({s['kind']}) <- {self.spans.get(s['parent'] or '', {}).get('name')}"
            for s in self.spans.values()
        )


async def collected(jaeger: JaegerProcess, trace_id: int, complete: Any, what: str) -> Tree:
    """Poll Jaeger until the trace satisfies `complete` (spans arrive from four processes, in batches)."""
    latest: list[Tree] = []

    def ready() -> bool:
        data = jaeger_trace(jaeger.query_url, trace_id)
        if data is None:
            return False
        latest[:] = [Tree(data)]
        return bool(complete(latest[0]))

    try:
        await wait_until(ready, timeout_s=60, interval_s=0.3, what=what)
    except AssertionError:
        raise AssertionError(f"{what}; Jaeger has: {latest[0].describe() if latest else 'nothing'}") from None
    return latest[0]
