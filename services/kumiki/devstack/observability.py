"""Jaeger v2 and Prometheus on loopback, for the tests and for `kumiki up --observability`.

Jaeger is built from the Go module proxy by infra/observability/build-jaeger.sh (cached under
~/.cache/kumiki) and runs all-in-one with memory storage: an OTLP receiver, the query API, nothing else. Its
config is written here with free ports for every listener, so two stacks (or two tests) never collide on
Jaeger's fixed defaults. Prometheus is the Debian package's server, scraping targets from a file this module
rewrites (file_sd), so services that start after it are picked up without a restart.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from kumiki.devstack.processes import StackError, alive, free_port, spawn, terminate

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_JAEGER = REPO_ROOT / "infra" / "observability" / "build-jaeger.sh"
JAEGER_MODULE_VERSION = "v1.76.0"  # the Jaeger v2.13.0 release
RULES_FILE = REPO_ROOT / "charts" / "kumiki" / "rules" / "kumiki-rules.yaml"


def cache_dir() -> Path:
    return Path(os.environ.get("KUMIKI_CACHE", Path.home() / ".cache" / "kumiki"))


def jaeger_binary() -> Path | None:
    """KUMIKI_JAEGER_BIN, else the cached build, else `jaeger` on PATH; None when there is none yet."""
    configured = os.environ.get("KUMIKI_JAEGER_BIN")
    if configured:
        return Path(configured)
    cached = cache_dir() / f"jaeger-{JAEGER_MODULE_VERSION}" / "jaeger"
    if cached.exists():
        return cached
    found = shutil.which("jaeger")
    return Path(found) if found else None


def build_jaeger(log_path: Path) -> Path:
    """Build Jaeger with Go (minutes cold, instant when cached); returns the binary."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        result = subprocess.run(["bash", str(BUILD_JAEGER)], stdout=subprocess.PIPE, stderr=log)
    if result.returncode != 0:
        raise StackError(f"building Jaeger {JAEGER_MODULE_VERSION} with Go failed; see {log_path}")
    return Path(result.stdout.decode().strip().splitlines()[-1])


def prometheus_binary() -> Path | None:
    found = os.environ.get("KUMIKI_PROMETHEUS_BIN") or shutil.which("prometheus")
    return Path(found) if found else None


def _get(url: str, timeout: float = 2.0) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bytes(response.read())
    except (OSError, urllib.error.URLError):
        return None


def _wait_http(url: str, pid: int, what: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _get(url) is not None:
            return
        if not alive(pid):
            raise StackError(f"{what} exited during start-up; see {log}")
        time.sleep(0.2)
    raise StackError(f"{what} was not ready at {url} within {timeout_s:.0f}s; see {log}")


@dataclass
class JaegerProcess:
    pid: int
    otlp_grpc_port: int
    otlp_http_port: int
    query_port: int
    metrics_port: int
    log: str

    @property
    def otlp_endpoint(self) -> str:
        """What OTEL_EXPORTER_OTLP_ENDPOINT is set to (OTLP over gRPC)."""
        return f"http://127.0.0.1:{self.otlp_grpc_port}"

    @property
    def query_url(self) -> str:
        return f"http://127.0.0.1:{self.query_port}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def jaeger_config(otlp_grpc: int, otlp_http: int, query_http: int, query_grpc: int, health: int, metrics: int) -> str:
    """Jaeger v2's all-in-one pipeline (OTLP in, memory storage, query API) with every listener on loopback.

    Jaeger's own spans stay out (`enable_tracing: false`), and its collector metrics are served for Prometheus."""
    config = {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {"receivers": ["otlp"], "processors": ["batch"], "exporters": ["jaeger_storage_exporter"]}
            },
            "telemetry": {
                "resource": {"service.name": "jaeger"},
                "metrics": {
                    "level": "basic",
                    "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": metrics}}}}],
                },
                "logs": {"level": "warn"},
            },
        },
        "extensions": {
            "jaeger_query": {
                "storage": {"traces": "memstore"},
                "enable_tracing": False,
                "http": {"endpoint": f"127.0.0.1:{query_http}"},
                "grpc": {"endpoint": f"127.0.0.1:{query_grpc}"},
            },
            "jaeger_storage": {"backends": {"memstore": {"memory": {"max_traces": 100_000}}}},
            "healthcheckv2": {"use_v2": True, "http": {"endpoint": f"127.0.0.1:{health}"}},
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"127.0.0.1:{otlp_grpc}"},
                    "http": {"endpoint": f"127.0.0.1:{otlp_http}"},
                }
            }
        },
        "processors": {"batch": {"timeout": "100ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memstore"}},
    }
    return yaml.safe_dump(config, sort_keys=False)


def start_jaeger(folder: Path, log_path: Path, *, binary: Path | None = None, timeout_s: float = 60.0) -> JaegerProcess:
    """Start Jaeger on free loopback ports; ready once the query API answers."""
    binary = binary or jaeger_binary()
    if binary is None:
        raise StackError(f"no Jaeger binary: build it with `bash {BUILD_JAEGER}` (Go, a few minutes, cached)")
    folder.mkdir(parents=True, exist_ok=True)
    ports = [free_port() for _ in range(6)]
    otlp_grpc, otlp_http, query_http, query_grpc, health, metrics = ports
    config = folder / "jaeger.yaml"
    config.write_text(jaeger_config(otlp_grpc, otlp_http, query_http, query_grpc, health, metrics))
    env = {**os.environ, "JAEGER_LISTEN_HOST": "127.0.0.1"}
    pid = spawn([str(binary), f"--config={config}"], log_path, env=env)
    process = JaegerProcess(pid, otlp_grpc, otlp_http, query_http, metrics, str(log_path))
    try:
        _wait_http(f"{process.query_url}/api/services", pid, "Jaeger", log_path, timeout_s)
    except StackError:
        terminate(pid)
        raise
    return process


@dataclass
class PrometheusProcess:
    pid: int
    port: int
    config: str
    targets_file: str
    data_dir: str
    log: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def prometheus_config(
    targets_file: Path, rule_files: Sequence[Path], scrape_interval_s: float, evaluation_interval_s: float
) -> str:
    """One job (`kumiki`) whose targets come from `targets_file`: each target carries `service` as a label."""
    config = {
        "global": {
            "scrape_interval": f"{scrape_interval_s:g}s",
            "scrape_timeout": f"{min(scrape_interval_s, 10):g}s",
            "evaluation_interval": f"{evaluation_interval_s:g}s",
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": "kumiki", "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}]}
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def write_targets(targets_file: Path, targets: Mapping[str, Sequence[str]]) -> None:
    """`targets`: component name -> host:port of its /metrics. Written atomically: Prometheus watches the file."""
    groups = [{"targets": list(addresses), "labels": {"component": name}} for name, addresses in targets.items()]
    temporary = targets_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(groups, indent=2))
    temporary.replace(targets_file)


def start_prometheus(
    folder: Path,
    log_path: Path,
    targets: Mapping[str, Sequence[str]],
    *,
    rule_files: Sequence[Path] = (RULES_FILE,),
    scrape_interval_s: float = 5.0,
    evaluation_interval_s: float = 5.0,
    port: int | None = None,
    timeout_s: float = 60.0,
) -> PrometheusProcess:
    """Start a Prometheus server on loopback scraping `targets` and evaluating `rule_files`."""
    binary = prometheus_binary()
    if binary is None:
        raise StackError("no prometheus binary: apt-get install prometheus (CI installs it)")
    folder.mkdir(parents=True, exist_ok=True)
    targets_file = folder / "targets.json"
    write_targets(targets_file, targets)
    config = folder / "prometheus.yml"
    config.write_text(prometheus_config(targets_file, rule_files, scrape_interval_s, evaluation_interval_s))
    data = folder / "data"
    port = port or free_port()
    argv = [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]
    pid = spawn(argv, log_path)
    process = PrometheusProcess(pid, port, str(config), str(targets_file), str(data), str(log_path))
    try:
        _wait_http(f"{process.url}/-/ready", pid, "Prometheus", log_path, timeout_s)
    except StackError:
        terminate(pid)
        raise
    return process


def stop(pid: int | None) -> bool:
    return terminate(pid)


# ---- `kumiki up --observability`: both, with their state in a folder of the stack's home ----------------------


def observability_state(folder: Path) -> dict[str, Any] | None:
    """What `start_observability` started in `folder`, while its Jaeger still runs (None otherwise)."""
    path = folder / "state.json"
    if not path.exists():
        return None
    state: dict[str, Any] = json.loads(path.read_text())
    return state if alive(state.get("jaeger", {}).get("pid")) else None


def start_observability(folder: Path, logs: Path, *, build: bool = True, progress: Any = None) -> dict[str, Any]:
    """Jaeger (built first when missing and `build`) and Prometheus with the chart's rules; Prometheus' targets
    are the stack's services, written by `set_targets` as they start. Returns the state (as state.json)."""
    running = observability_state(folder)
    if running is not None:
        return running
    binary = jaeger_binary()
    if binary is None:
        if not build:
            raise StackError(f"no Jaeger binary: build it with `bash {BUILD_JAEGER}`")
        if progress is not None:
            progress("building Jaeger v2 with Go (once, a few minutes; cached under ~/.cache/kumiki)")
        binary = build_jaeger(logs / "jaeger-build.log")
    jaeger = start_jaeger(folder / "jaeger", logs / "jaeger.log", binary=binary)
    try:
        prometheus = start_prometheus(folder / "prometheus", logs / "prometheus.log", {})
    except StackError:
        terminate(jaeger.pid)
        raise
    state = {"jaeger": jaeger.as_dict(), "prometheus": prometheus.as_dict()}
    (folder / "state.json").write_text(json.dumps(state, indent=2))
    return state


def set_targets(folder: Path, targets: Mapping[str, Sequence[str]]) -> None:
    """Point the stack's Prometheus at these /metrics addresses (it re-reads the file within a second)."""
    state = observability_state(folder)
    if state is not None:
        write_targets(Path(state["prometheus"]["targets_file"]), targets)


def stop_observability(folder: Path) -> bool:
    """Stop what `start_observability` started there; True when something was running."""
    path = folder / "state.json"
    if not path.exists():
        return False
    state = json.loads(path.read_text())
    stopped = [terminate(state.get(part, {}).get("pid")) for part in ("prometheus", "jaeger")]
    path.unlink()
    return any(stopped)


def observability_rows(folder: Path) -> list[dict[str, Any]]:
    """`kumiki status` rows for Jaeger and Prometheus."""
    path = folder / "state.json"
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    rows = []
    jaeger, prometheus = state.get("jaeger"), state.get("prometheus")
    if jaeger:
        up = alive(jaeger["pid"]) and _get(f"http://127.0.0.1:{jaeger['query_port']}/api/services") is not None
        rows.append(
            {
                "component": "jaeger",
                "kind": f"Jaeger v2 ({JAEGER_MODULE_VERSION}), memory storage",
                "address": f"otlp :{jaeger['otlp_grpc_port']} query http://127.0.0.1:{jaeger['query_port']}",
                "pid": jaeger["pid"],
                "health": "ready" if up else "down",
            }
        )
    if prometheus:
        up = alive(prometheus["pid"]) and _get(f"http://127.0.0.1:{prometheus['port']}/-/ready") is not None
        rows.append(
            {
                "component": "prometheus",
                "kind": "Prometheus (chart rules loaded)",
                "address": f"http://127.0.0.1:{prometheus['port']}",
                "pid": prometheus["pid"],
                "health": "ready" if up else "down",
            }
        )
    return rows
