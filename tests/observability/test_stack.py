"""`kumiki up --observability`: Jaeger and Prometheus next to the five services, a CLI bind traced into Jaeger and
shown by `kumiki trace`, every service scraped, and `kumiki down` stopping them too. Real everything: Apache
Kafka and Postgres from CI, the Jaeger binary built from the Go module proxy, Prometheus from Debian."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.devstack.observability import JaegerProcess, observability_state
from kumiki.devstack.processes import alive
from tests.conftest import REPO_ROOT, wait_until
from tests.observability.support import QUEUES, prometheus_query
from tests.placement.support import default_nodes, emulate


async def test_up_with_observability_traces_and_scrapes_the_stack(
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    jaeger: JaegerProcess,  # the session's: proves the binary is there; the stack starts its own
    prometheus_available: None,
    tmp_path: Path,
) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text(yaml.safe_dump(QUEUES))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("KUMIKI_", "OTEL_"))},
        "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}",
        "KUMIKI_HOME": str(tmp_path / "home"),
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_DATABASE_URL": database_settings.url,
        "KUMIKI_QUOTA_CONFIG_FILE": str(queues),
        "KUMIKI_LOG_LEVEL": "WARNING",
    }

    def kumiki(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "kumiki.cli", *argv], env=env, capture_output=True, text=True, timeout=timeout
        )

    await emulate(kafka, default_nodes(4))
    running = None
    try:
        up = kumiki("up", "--observability", "--no-replay", "--timeout-s", "180", timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "traces: Jaeger query API http://127.0.0.1:" in up.stderr
        running = observability_state(tmp_path / "home" / "observability")
        assert running is not None
        rows = {row["component"]: row for row in json.loads(kumiki("status", "--json").stdout)}
        assert rows["jaeger"]["health"] == rows["prometheus"]["health"] == "ready"

        bound = kumiki("placement", "bind", "stack-job", "--queue", "team-a", "--gpus", "1")
        assert bound.returncode == 0 and "OUTCOME_BOUND" in bound.stdout, bound.stdout + bound.stderr

        def traced() -> bool:
            shown = kumiki("trace", "stack-job")  # finds the stack's Jaeger by itself
            return shown.returncode == 0 and "process " in shown.stdout and "kumiki-quota" in shown.stdout

        await wait_until(traced, timeout_s=60, interval_s=1, what="the bind's trace through the stack's Jaeger")
        shown = kumiki("trace", "stack-job").stdout
        assert "bound on node-" in shown.splitlines()[0]
        assert "kumiki-cli  kumiki placement bind" in shown, "the CLI sent its span to the stack's Jaeger too"

        url = f"http://127.0.0.1:{running['prometheus']['port']}"
        services = {"telemetry-ingest", "forecast", "placement", "preemption", "quota"}

        def scraped() -> bool:
            up = {sample["metric"]["component"]: sample["value"][1] for sample in prometheus_query(url, "up")}
            return services <= set(up) and all(up[name] == "1" for name in services)

        await wait_until(scraped, timeout_s=60, interval_s=0.5, what="Prometheus scraping every service")
    finally:
        down = kumiki("down", timeout=120)
    assert down.returncode == 0 and "jaeger and prometheus" in down.stderr, down.stderr
    assert running is not None
    assert not alive(running["jaeger"]["pid"]) and not alive(running["prometheus"]["pid"])
