"""A real Prometheus server (the Debian package) scraping the live stack: the five services and a node agent as
processes on Apache Kafka and Postgres. The chart's recording and alerting rules
(charts/kumiki/rules/kumiki-rules.yaml, unchanged) are evaluated on the live series, and an alert fires for
the reason it should: a record consumers cannot decode raises KumikiDeadLetters naming its topic and groups,
and nothing else fires."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
from aiokafka import AIOKafkaProducer

from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.devstack.observability import start_prometheus
from kumiki.devstack.processes import free_port, terminate
from tests.agent.fake_nvml.build import FakeNvmlConfig, build_library
from tests.conftest import REPO_ROOT, wait_until
from tests.observability.support import ALL_SERVICES, get_json, live_stack, prometheus_query
from tests.placement.support import bind_request, default_nodes, emulate, whole

GIB = 1024**3
NODE = "obs-node-a"


def start_agent(kafka: KafkaSettings, folder: Path, metrics_port: int) -> subprocess.Popen[bytes]:
    """`python -m kumiki.agent` on the fake libnvidia-ml.so.1 (no GPU here), publishing to Kafka, with /metrics."""
    library = build_library(folder / "fake_nvml")
    config = FakeNvmlConfig(
        gpus=[
            {
                "uuid": "GPU-obs-0",
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_total": 80 * GIB,
                "memory_used": 1 * GIB,
                "util_gpu": [2, 3],
                "mig": "off",
                "nvlink_count": 0,
            }
        ]
    ).write(folder / "fake_nvml.ini")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")},
        "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}",
        "LD_LIBRARY_PATH": str(library.parent),
        "FAKE_NVML_CONFIG": str(config),
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
    }
    argv = [
        sys.executable,
        "-m",
        "kumiki.agent",
        "--node",
        NODE,
        "--interval-s",
        "0.5",
        "--output",
        "kafka",
        "--metrics-port",
        str(metrics_port),
        "--log-level",
        "WARNING",
    ]
    with (folder / "agent.log").open("wb") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def firing(url: str) -> set[tuple[str, str, str]]:
    alerts = get_json(f"{url}/api/v1/alerts")["data"]["alerts"]
    return {
        (alert["labels"]["alertname"], alert["labels"].get("topic", ""), alert["labels"].get("group", ""))
        for alert in alerts
        if alert["state"] == "firing"
    }


def rule_health(url: str) -> dict[str, str]:
    groups = get_json(f"{url}/api/v1/rules")["data"]["groups"]
    return {
        rule["name"]: rule["health"] + (f": {rule.get('lastError')}" if rule.get("lastError") else "")
        for group in groups
        for rule in group["rules"]
    }


async def test_prometheus_scrapes_the_stack_and_the_rules_fire_on_live_series(
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    prometheus_available: None,
    tmp_path: Path,
) -> None:
    await emulate(kafka, default_nodes(4))
    agent_port = free_port()
    agent = start_agent(kafka, tmp_path, agent_port)
    prometheus = None
    try:
        with live_stack(kafka, database_settings, tmp_path / "stack", names=ALL_SERVICES) as stack:
            await wait_until(stack.ready, timeout_s=180, interval_s=0.5, what="the five services ready")
            targets = {name: [service.metrics_address] for name, service in stack.services.items()}
            targets["agent"] = [f"127.0.0.1:{agent_port}"]
            prometheus = start_prometheus(
                tmp_path / "prometheus",
                tmp_path / "prometheus.log",
                targets,
                scrape_interval_s=1,
                evaluation_interval_s=1,
            )
            url = prometheus.url

            def all_up() -> bool:
                up = {sample["metric"]["component"]: sample["value"][1] for sample in prometheus_query(url, "up")}
                return up == {name: "1" for name in targets}

            await wait_until(all_up, timeout_s=60, interval_s=0.5, what="every target scraped up")
            # every rule of the chart evaluates without error on the live series
            await wait_until(
                lambda: all(health == "ok" for health in rule_health(url).values()),
                timeout_s=30,
                interval_s=0.5,
                what="every rule evaluated",
            )
            assert len(rule_health(url)) >= 16

            # live series through the rules: a bind, the agent's own metrics, telemetry folding its samples
            async with grpc.aio.insecure_channel(stack.services["placement"].grpc_address) as channel:
                stub = placement_pb2_grpc.PlacementStub(channel)
                reply = await stub.Bind(bind_request("scraped-job", [whole(2)]))
                assert reply.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
                # fragmentation: the one H100 node is full, so a second 8-GPU H100 pod waits for capacity and
                # every other node's free GPUs are stranded for it; quota holds a job of team-b's back
                for job in ("h100-first", "h100-waits"):
                    await stub.Bind(bind_request(job, [whole(8, "H100-80GB")]))
                held = await stub.Bind(bind_request("held-job", [whole(8)], queue="team-b"))
                assert held.outcome == placement_pb2.BindResponse.OUTCOME_PENDING
                # forecast accuracy: a job that ran is scored against the forecast it was given
                released = await stub.Release(
                    placement_pb2.ReleaseRequest(
                        job=common_pb2.JobRef(job_id="scraped-job", generation=1),
                        reason="done",
                        final_state=events_pb2.JOB_STATE_COMPLETED,
                    )
                )
                assert released.released
            await wait_until(
                lambda: prometheus_query(url, 'kumiki:placement_binds:rate5m{outcome="bound"} > 0'),
                timeout_s=30,
                what="the recorded bind rate",
            )
            await wait_until(
                lambda: prometheus_query(url, 'kumiki_placement_stranded_gpus{shape="8x A100-80GB"} > 0'),
                timeout_s=30,
                what="stranded A100 GPUs while an H100 pod waits",
            )
            await wait_until(  # the recording rule, a rule evaluation after the scrape
                lambda: prometheus_query(url, "kumiki:placement_stranded_gpus:sum >= 8"),
                timeout_s=30,
                what="the recorded stranded-GPU sum",
            )
            await wait_until(
                lambda: prometheus_query(url, 'kumiki_placement_pending_jobs_by_reason{reason="quota"} == 1'),
                timeout_s=30,
                what="the held job counted under reason quota",
            )
            await wait_until(
                lambda: prometheus_query(url, "kumiki_forecast_scored_total > 0"),
                timeout_s=30,
                what="forecast scoring the completed job",
            )
            (coverage,) = prometheus_query(url, "kumiki_forecast_p90_coverage_ratio")
            assert float(coverage["value"][1]) in (0.0, 1.0), "one ending: covered or not"
            assert prometheus_query(url, "kumiki_forecast_abs_log_error >= 0")
            await wait_until(
                lambda: prometheus_query(url, f'kumiki_agent_samples_total{{node="{NODE}"}} > 0'),
                timeout_s=30,
                what="the agent's samples counted on its /metrics",
            )
            (gpus,) = prometheus_query(url, f'kumiki_agent_gpus{{node="{NODE}"}}')
            assert gpus["value"][1] == "1"
            await wait_until(
                lambda: prometheus_query(url, f'kumiki_node_healthy{{node="{NODE}"}} == 1'),
                timeout_s=60,
                what="telemetry-ingest folding the agent's samples into a healthy node",
            )
            assert firing(url) == set(), "nothing fires on a healthy stack"

            # a record nobody can decode: quota's and forecast's consumers dead-letter it, the alert says so
            producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
            await producer.start()
            try:
                await producer.send_and_wait(
                    JOB_LIFECYCLE.full_name(kafka.topic_prefix), b"\xff\x00 not a JobLifecycle", key=b"garbage"
                )
            finally:
                await producer.stop()
            # every consumer group of job.lifecycle refuses it (quota, forecast, preemption, telemetry-ingest)
            await wait_until(
                lambda: {"kumiki-quota", "kumiki-forecast"} <= {group for _, _, group in firing(url)},
                timeout_s=60,
                what="KumikiDeadLetters firing for quota's and forecast's consumers",
            )
            alerts = firing(url)
            assert {name for name, _, _ in alerts} == {"KumikiDeadLetters"}, f"only the dead-letter alert: {alerts}"
            assert {topic for _, topic, _ in alerts} == {"job.lifecycle"}, "for the topic the record went to"
            (count,) = prometheus_query(url, 'kumiki_bus_dead_lettered_total{group="kumiki-quota"}')
            assert count["metric"]["topic"] == "job.lifecycle" and count["value"][1] == "1", "one record, once"
    finally:
        if prometheus is not None:
            terminate(prometheus.pid)
        terminate(agent.pid)
