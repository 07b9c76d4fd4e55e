"""`kumiki trace JOB` against a real Jaeger: binds made by the real CLI (`kumiki placement bind`, traced) through
placement, quota and forecast processes, printed back as trees from Jaeger's query API."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kumiki.cli.trace import find_traces
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.devstack.observability import JaegerProcess
from tests.conftest import REPO_ROOT, wait_until
from tests.observability.support import live_stack
from tests.placement.support import default_nodes, emulate


def kumiki(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KUMIKI_", "OTEL_"))}
    base["PYTHONPATH"] = f"{REPO_ROOT / 'services'}:{REPO_ROOT}"
    return subprocess.run(
        [sys.executable, "-m", "kumiki.cli", *argv],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_trace_prints_a_bind_and_a_wait_as_trees(
    kafka: KafkaSettings, database_settings: DatabaseSettings, jaeger: JaegerProcess, tmp_path: Path
) -> None:
    await emulate(kafka, default_nodes(4))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint}
    with live_stack(kafka, database_settings, tmp_path, env) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement, quota and forecast ready")
        placement = ["placement", "--address", stack.services["placement"].grpc_address]
        bound = kumiki(*placement, "bind", "cli-bound", "--queue", "team-a", "--gpus", "2", env=env)
        assert bound.returncode == 0, bound.stderr
        held = kumiki(*placement, "bind", "cli-held", "--queue", "team-b", "--gpus", "8", env=env)
        assert held.returncode == 0 and "OUTCOME_PENDING" in held.stdout, held.stdout + held.stderr
        lifecycle = f"process {kafka.topic_prefix}job.lifecycle [consumer]"

        def complete(job: str) -> bool:
            traces = find_traces(jaeger.query_url, job, 600, 5)
            services = {p["serviceName"] for t in traces for p in t["processes"].values()}
            names = {s["operationName"] for t in traces for s in t["spans"]}
            return {"kumiki-cli", "kumiki-quota", "kumiki-forecast"} <= services and any(
                name.startswith("process ") for name in names
            )

        await wait_until(lambda: complete("cli-bound") and complete("cli-held"), timeout_s=60, what="both traces")

    shown = kumiki("trace", "cli-bound", "--jaeger", jaeger.query_url)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert re.match(
        r"trace [0-9a-f]{32}  \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC  [\d.]+ ms  bound on node-\d+$", lines[0]
    )
    tree = "\n".join(lines)
    # the CLI's span is the root; each level is indented under its parent, with durations and offsets
    assert lines[1].startswith("└─ kumiki-cli  kumiki placement bind  "), tree
    assert lines[2].startswith("   └─ kumiki-cli  kumiki.v1.Placement/Bind [client]  "), tree
    assert lines[3].startswith("      └─ kumiki-placement  kumiki.v1.Placement/Bind [server]  "), tree
    assert lines[4].startswith("         └─ kumiki-placement  schedule  "), tree
    assert re.search(r"outcome=bound queue=team-a gpus=2 nodes=node-\d+(  |$)", lines[4]), tree
    assert any(line.startswith("            ├─ kumiki-placement  kumiki.v1.Quota/Admit [client]") for line in lines)
    assert any(line.startswith("            │  └─ kumiki-quota  kumiki.v1.Quota/Admit [server]") for line in lines)
    assert any(line.startswith("            └─ kumiki-placement  send [producer]") for line in lines), tree
    consumers = [line for line in lines if lifecycle in line]
    assert {line.split()[1] for line in consumers} >= {"kumiki-quota", "kumiki-forecast"}, tree
    assert all(line.startswith("               ") for line in consumers), "consumers sit under the send span"
    assert all(" ms  @+" in line for line in lines[1:]), "every span has its duration and its offset"

    waiting = kumiki("trace", "cli-held", "--jaeger", jaeger.query_url)
    assert waiting.returncode == 0, waiting.stderr
    first = waiting.stdout.splitlines()[0]
    assert "pending: cli-held: quota:" in first and "team-b" in first, first
    assert "quota.outcome=denied" in waiting.stdout

    nothing = kumiki("trace", "never-submitted", "--jaeger", jaeger.query_url)
    assert nothing.returncode == 3 and "no decision traces for job 'never-submitted'" in nothing.stderr
    away = kumiki("trace", "cli-bound", "--jaeger", "http://127.0.0.1:9")
    assert away.returncode == 1 and "cannot reach Jaeger's query API at http://127.0.0.1:9" in away.stderr
    bad = kumiki("trace", "cli-bound", "--since", "yesterday")
    assert bad.returncode == 2 and "--since: expected a duration like 30m, 24h or 7d" in bad.stderr
