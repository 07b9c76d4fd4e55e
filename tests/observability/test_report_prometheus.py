"""`kumiki report --prometheus URL --start T --end T` against a real Prometheus server (the Debian package)
scraping placement as a process over Apache Kafka: the report's figures come from range queries over what
the stack exported while jobs were bound, waited and completed, and bad input is refused naming the flag."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.devstack.cluster import emulated_nodes
from kumiki.devstack.observability import start_prometheus
from kumiki.devstack.processes import free_port, terminate
from tests.conftest import REPO_ROOT, wait_until
from tests.observability.support import live_stack, prometheus_query
from tests.placement.support import bind_request, emulate, whole
from tests.preemption.support import H100

BOUND = placement_pb2.BindResponse.OUTCOME_BOUND
PENDING = placement_pb2.BindResponse.OUTCOME_PENDING


def kumiki(*argv: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, as test_trace_cli runs it, with room for a loaded machine (Python starts slowly there)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("KUMIKI_", "OTEL_"))}
    base["PYTHONPATH"] = f"{REPO_ROOT / 'services'}:{REPO_ROOT}"
    command = [sys.executable, "-m", "kumiki.cli", *argv]
    return subprocess.run(command, env=base, capture_output=True, text=True, timeout=180)


def value(url: str, query: str) -> float | None:
    found = prometheus_query(url, query)
    return float(found[0]["value"][1]) if found else None


async def test_report_reads_the_runs_figures_from_a_real_prometheus(
    kafka: KafkaSettings, database_settings: DatabaseSettings, prometheus_available: None, tmp_path: Path
) -> None:
    await emulate(kafka, emulated_nodes(2, shapes=(H100,)))
    with live_stack(kafka, database_settings, tmp_path / "stack", names=("placement",)) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement ready")
        prometheus = start_prometheus(
            tmp_path / "prometheus",
            tmp_path / "prometheus.log",
            {"placement": [stack.services["placement"].metrics_address]},
            scrape_interval_s=1,
            evaluation_interval_s=1,
        )
        try:
            url = prometheus.url
            await wait_until(lambda: value(url, "up") == 1, timeout_s=60, interval_s=0.5, what="placement up")
            began = time.time()
            await wait_until(  # a scrape inside the range before anything happens: the "before" of each counter
                lambda: value(url, f"timestamp(kumiki_placement_pending_jobs) > {began}") is not None,
                timeout_s=30,
                interval_s=0.5,
                what="a scrape after the range's start",
            )
            async with grpc.aio.insecure_channel(stack.services["placement"].grpc_address) as channel:
                stub = placement_pb2_grpc.PlacementStub(channel)
                for job in ("report-a", "report-b"):
                    assert (await stub.Bind(bind_request(job, [whole(4)]))).outcome == BOUND
                gang = await stub.Bind(bind_request("report-gang", [whole(8), whole(8)]))
                assert gang.outcome == PENDING  # both nodes, whole: it waits for a and b
                await wait_until(
                    lambda: (
                        value(url, "kumiki_placement_pending_jobs") == 1
                        and value(url, "kumiki_placement_allocated_gpus") == 8
                    ),
                    timeout_s=30,
                    interval_s=0.5,
                    what="Prometheus to see 8 GPUs held and a job waiting",
                )
                for job in ("report-a", "report-b"):
                    await stub.Release(
                        placement_pb2.ReleaseRequest(
                            job=common_pb2.JobRef(job_id=job, generation=1), final_state=events_pb2.JOB_STATE_COMPLETED
                        )
                    )
                await wait_until(
                    lambda: (
                        value(url, "sum(kumiki_placement_job_completion_seconds_count)") == 2
                        and value(url, "kumiki_placement_allocated_gpus") == 16
                    ),
                    timeout_s=30,
                    interval_s=0.5,
                    what="Prometheus to see two completions and the gang bound by the cycle",
                )
            ended = time.time()

            out = kumiki("report", "--prometheus", url, "--start", f"{began:.3f}", "--end", f"{ended:.3f}", "--json")
            assert out.returncode == 0, out.stderr
            figures = json.loads(out.stdout)["range"]
            assert figures["completed"] == 2 and figures["failed"] == 0
            assert figures["binds"] == 3  # a and b on arrival, the gang by the scheduling cycle
            assert figures["binds_per_s"] == pytest.approx(3 / (ended - began), rel=1e-3)
            assert figures["max_pending"] == 1 and 0 < figures["avg_pending"] < 1
            assert 0 < figures["avg_allocated_gpus"] <= 16
            assert figures["avg_jct_s"] > 0 and figures["p95_jct_s"] > 0
            assert figures["avg_queue_s"] > 0  # the gang waited; a and b did not
            assert figures["jobs_per_gpu_h"] > 0
            for missing in ("allocation", "utilisation_pct", "idle_gpu_h", "pods_bound", "lost_gpu_h"):
                assert figures[missing] is None, missing  # no telemetry, binder or preemption scraped here

            # the Markdown, with a "before" range: the first half against the whole run
            middle = (began + ended) / 2
            text = kumiki(
                "report",
                *("--prometheus", url, "--start", f"{began:.3f}", "--end", f"{ended:.3f}"),
                *("--baseline-start", f"{began:.3f}", "--baseline-end", f"{middle:.3f}"),
            )
            assert text.returncode == 0, text.stderr
            assert "| jobs completed |" in text.stdout and "| 2 |" in text.stdout
            assert "| GPUs allocated (share of capacity) | - | - | - |" in text.stdout
            print(text.stdout)  # docs/observability.md shows this output

            # input checks, each naming the flag
            long_ago = ("--start", "2020-01-01T00:00:00Z", "--end", "2020-01-01T01:00:00Z")
            empty = kumiki("report", "--prometheus", url, *long_ago)
            assert empty.returncode == 2 and "--start/--end: Prometheus at" in empty.stderr, empty.stderr
            assert "has no Kumiki series" in empty.stderr
            away = kumiki("report", "--prometheus", f"http://127.0.0.1:{free_port()}", "--start=-1h")
            assert away.returncode == 1
            assert "--prometheus: cannot reach a Prometheus server" in away.stdout + away.stderr
            bad = kumiki("report", "--prometheus", "prometheus:9090", "--start=-1h")
            assert bad.returncode == 2 and "--prometheus: expected http(s)://" in bad.stderr
            backwards = kumiki("report", "--prometheus", url, "--start", f"{ended:.3f}", "--end", f"{began:.3f}")
            assert backwards.returncode == 2 and "--end: must be after --start" in backwards.stderr
            no_start = kumiki("report", "--prometheus", url)
            assert no_start.returncode == 2 and "--start: required with --prometheus" in no_start.stderr
        finally:
            terminate(prometheus.pid)
