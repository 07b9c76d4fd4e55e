"""End to end on a real broker (Apache Kafka and noida-db): two node agents, each a `python -m kumiki.agent`
process against the fake libnvidia-ml.so.1 publishing with `--output kafka`, and `python -m kumiki.telemetry`
(faust inside the service shell) → kumiki.cluster.state, kumiki.gpu.idle and kumiki.dead-letter.

On Apache Kafka the telemetry process is then SIGKILLed and restarted: its tables (allocations, node
versions) come back from the changelog topics.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import (
    CLUSTER_STATE,
    GPU_SAMPLES,
    JOB_LIFECYCLE,
)
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.devstack.processes import free_port
from kumiki.telemetry.core import FREE_GPUS_LABEL
from tests.conftest import wait_until
from tests.telemetry.support import BUSY_GPU, IDLE_GPU, Processes, Topics, node_a, node_b, ready, service_env

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def running(job: str, node: str, gpu: int, queue: str) -> tuple[str, events_pb2.JobLifecycle]:
    return job, events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job, generation=1),
        state=events_pb2.JOB_STATE_RUNNING,
        queue=queue,
        assignments=[common_pb2.PodAssignment(node=node, gpu_indices=[gpu])],
        gpus=1,
    )


async def test_agents_to_cluster_state_and_gpu_idle(
    kafka_settings: KafkaSettings,
    broker_kind: str,
    topics: Topics,
    processes: Processes,
    fake_nvml_library: Path,
    tmp_path: Path,
) -> None:
    http_port = free_port()
    env = service_env(kafka_settings, http_port)
    processes.start("telemetry", ["-m", "kumiki.telemetry"], env)
    await wait_until(lambda: ready(http_port), timeout_s=60, what=f"telemetry ready\n{processes.log('telemetry')}")

    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        await producer.publish_many(
            JOB_LIFECYCLE, [running("idle-job", "node-a", 0, "research"), running("busy-job", "node-a", 1, "prod")]
        )
        for name, config in (("node-a", node_a()), ("node-b", node_b())):
            agent_env = {
                **env,
                "LD_LIBRARY_PATH": str(fake_nvml_library),
                "FAKE_NVML_CONFIG": str(config.write(tmp_path / f"{name}.ini")),
            }
            processes.start(
                name, ["-m", "kumiki.agent", "--node", name, "--interval-s", "0.2", "--output", "kafka"], agent_env
            )

        async def idle_reported() -> bool:
            await topics.poll()
            return any(event.job.job_id == "idle-job" for event in topics.idle)

        await wait_until(  # a bound, not a wait: on a loaded 2-core machine the first fold took over 60 s
            idle_reported,
            timeout_s=180,
            what=f"gpu.idle for idle-job\n{processes.log('node-a')}\n{processes.log('telemetry')}",
        )
        (idle,) = [event for event in topics.idle if event.job.job_id == "idle-job"]
        assert (idle.queue, idle.node, list(idle.gpu_uuids)) == ("research", "node-a", [IDLE_GPU])
        assert 1.0 <= idle.mean_utilization_pct <= 3.0
        idle_s = idle.until.ToNanoseconds() / 1e9 - idle.since.ToNanoseconds() / 1e9
        assert idle_s >= 1.5 and idle.idle_gpu_seconds == pytest.approx(idle_s)

        # The busy job has been held as long; its GPU's state shows why it is not idle.
        state = topics.latest("node-a")
        assert state is not None and state.healthy
        gpus = {gpu.uuid: gpu for gpu in state.gpus}
        assert set(gpus) == {IDLE_GPU, BUSY_GPU}
        assert gpus[BUSY_GPU].utilization_pct >= 88 and gpus[IDLE_GPU].utilization_pct <= 3
        assert {gpu.model for gpu in gpus.values()} == {"NVIDIA A100-SXM4-80GB"}
        assert {gpu.memory_mib for gpu in gpus.values()} == {80 * 1024}
        assert gpus[IDLE_GPU].nvlink_island == gpus[BUSY_GPU].nvlink_island == 0
        assert state.labels["kumiki.dev/pcie-0-1"] == "SINGLE"
        assert state.labels[FREE_GPUS_LABEL] == ""  # both held
        assert not any(event.job.job_id == "busy-job" for event in topics.idle)
        # ... and gpu.busy says it computes (placement lifts a reclaimed job's demotion on it), once for the attempt

        async def busy_reported() -> bool:
            await topics.poll()
            return any(event.job.job_id == "busy-job" for event in topics.busy)

        await wait_until(busy_reported, timeout_s=60, what=f"gpu.busy for busy-job\n{processes.log('telemetry')}")
        busy = [event for event in topics.busy if event.job.job_id == "busy-job"]
        assert [(event.queue, event.node, list(event.gpu_uuids)) for event in busy] == [("prod", "node-a", [BUSY_GPU])]
        assert busy[0].mean_utilization_pct >= 88
        assert busy[0].until.ToNanoseconds() - busy[0].since.ToNanoseconds() >= 1.5e9
        assert not any(event.job.job_id == "idle-job" for event in topics.busy)

        async def node_b_known() -> bool:
            await topics.poll()
            latest = topics.latest("node-b")
            return latest is not None and latest.healthy and len(latest.gpus) == 1

        await wait_until(node_b_known, timeout_s=30, what="node-b state")
        node_b_state = topics.latest("node-b")
        assert node_b_state is not None
        assert node_b_state.labels[FREE_GPUS_LABEL] == "0" and node_b_state.gpus[0].model == "NVIDIA L4"

        # An impossible sample is dead-lettered with the reason, as every consumer does.
        bad = events_pb2.GpuSample(node="node-a", gpu_uuid=IDLE_GPU, gpu_utilization_pct=150.0)
        bad.sampled_at.GetCurrentTime()
        await producer.publish(GPU_SAMPLES, f"node-a/{IDLE_GPU}", bad)

        async def dead_lettered() -> bool:
            await topics.poll()
            return bool(topics.dead)

        await wait_until(dead_lettered, timeout_s=30, what="dead letter")
        (headers,) = topics.dead
        assert headers["kumiki_dlq_reason"] == b"undecodable: gpu_utilization_pct: must be within 0..100, got 150"
        assert headers["kumiki_dlq_topic"] == GPU_SAMPLES.full_name(kafka_settings.topic_prefix).encode()
        assert headers["ce_type"] == b"dev.kumiki.v1.GpuSample"

        # A sample from a node nobody registered (no inventory, no cluster.state) is dead-lettered with the
        # original bytes; a node registered only by a cluster.state record (a simulated or externally
        # managed node, no agent) is accepted.
        stray = events_pb2.GpuSample(node="node-z", gpu_uuid="GPU-z0", gpu_utilization_pct=10.0)
        stray.sampled_at.GetCurrentTime()
        await producer.publish(GPU_SAMPLES, "node-z/GPU-z0", stray)
        await producer.publish(CLUSTER_STATE, "node-y", events_pb2.NodeState(node="node-y"))
        known = events_pb2.GpuSample(node="node-y", gpu_uuid="GPU-y0", gpu_utilization_pct=30.0, memory_total_mib=24576)
        known.sampled_at.GetCurrentTime()
        await producer.publish(GPU_SAMPLES, "node-y/GPU-y0", known)

        async def stray_rejected_and_node_y_folded() -> bool:
            await topics.poll()
            node_y = topics.latest("node-y")
            return len(topics.dead) == 2 and node_y is not None and len(node_y.gpus) == 1

        await wait_until(stray_rejected_and_node_y_folded, timeout_s=30, what="unknown node rejected, node-y state")
        prefix = kafka_settings.topic_prefix
        assert (
            topics.dead[1]["kumiki_dlq_reason"]
            == (
                f"unknown node: node: 'node-z' has no record on {prefix}node.inventory or {prefix}cluster.state"
            ).encode()
        )
        assert topics.dead[1]["ce_type"] == b"dev.kumiki.v1.GpuSample"
        assert topics.dead_values[1] == stray.SerializeToString()
        node_y = topics.latest("node-y")
        assert node_y is not None and node_y.healthy and node_y.gpus[0].uuid == "GPU-y0"
        assert topics.latest("node-z") is None

        # A node that stops reporting becomes unhealthy.
        processes.stop("node-b")

        async def node_b_unhealthy() -> bool:
            await topics.poll()
            latest = topics.latest("node-b")
            return latest is not None and not latest.healthy

        await wait_until(node_b_unhealthy, timeout_s=30, what="node-b unhealthy")

        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{http_port}/metrics") as reply:
            text = await reply.text()
        assert 'kumiki_node_healthy{node="node-b"} 0.0' in text
        assert 'kumiki_node_allocated_gpus{node="node-a"} 2.0' in text
        assert 'kumiki_queue_idle_gpu_hours_total{queue="research"}' in text

        if broker_kind == "noida":
            return  # noida-db keeps a SIGKILLed member in the group for ever (README, "Brokers")

        # Tables survive a crash: after SIGKILL and restart, node-a's state still knows both holders
        # (job.lifecycle is not re-read: its offsets are committed) and its version continues.
        before = topics.latest("node-a")
        assert before is not None
        processes.stop("telemetry", signal.SIGKILL)
        restarted_at = time.time()
        processes.start("telemetry", ["-m", "kumiki.telemetry"], env)
        await wait_until(lambda: ready(http_port), timeout_s=90, what="telemetry ready after restart")

        async def republished() -> bool:
            await topics.poll()
            latest = topics.latest("node-a")
            return latest is not None and latest.version.observed_at.ToNanoseconds() / 1e9 > restarted_at

        await wait_until(republished, timeout_s=60, what="node-a state after restart")
        after = topics.latest("node-a")
        assert after is not None
        assert after.labels[FREE_GPUS_LABEL] == ""
        assert after.version.version > before.version.version
        await asyncio.sleep(0)  # nothing else to wait for: the assertions above are on records already read
