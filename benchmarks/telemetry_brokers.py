"""Does the telemetry worker (faust-streaming + aiokafka) work on a given Kafka-compatible broker? One command:

    python benchmarks/telemetry_brokers.py --bootstrap HOST:PORT [--bootstrap HOST:PORT ...] [--no-idempotence]

For each broker, in one process: create the topics, publish inventory and samples through the agent's Kafka
sink, run the worker (aiokafka front end + faust agents and tables), and check each step: cluster.state
published with the expected content, gpu.idle for the idle job and none for the busy one, an invalid sample in
the dead-letter topic, then a stopped-and-restarted worker whose tables come back from the changelog (the node
state's version continues). Prints a table of what worked and what broke, with the error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.table import Table

from kumiki.agent.adapters.kafka import KafkaSink
from kumiki.agent.core import GpuDevice, GpuInventory, GpuSample, SampleFields
from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import (
    ALL_TOPICS,
    CLUSTER_STATE,
    DEAD_LETTER,
    GPU_IDLE,
    GPU_SAMPLES,
    JOB_LIFECYCLE,
)
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.telemetry.adapters.streams import TelemetryStreams
from kumiki.telemetry.core import IdleRule, TelemetryConfig

CONFIG = TelemetryConfig(
    gpu_window_s=10,
    usage_window_s=10,
    usage_step_s=10,
    node_timeout_s=5,
    publish_interval_s=0.5,
    idle_default=IdleRule(10.0, 1.5),
    session_timeout_s=6,
)
GIB = 1024**3


class Outputs:
    def __init__(self, settings: KafkaSettings) -> None:
        specs = (CLUSTER_STATE, GPU_IDLE, DEAD_LETTER)
        self.names = {spec.full_name(settings.topic_prefix): spec.name for spec in specs}
        self.consumer = AIOKafkaConsumer(
            *self.names, bootstrap_servers=settings.bootstrap, auto_offset_reset="earliest", group_id=None
        )
        self.states: list[events_pb2.NodeState] = []
        self.idle: list[events_pb2.GpuIdle] = []
        self.dead: list[dict[str, bytes]] = []

    async def poll(self) -> None:
        for partition, records in (await self.consumer.getmany(timeout_ms=100)).items():
            name = self.names[partition.topic]
            for record in records:
                if name == "cluster.state":
                    self.states.append(events_pb2.NodeState.FromString(record.value))
                elif name == "gpu.idle":
                    self.idle.append(events_pb2.GpuIdle.FromString(record.value))
                else:
                    self.dead.append(dict(record.headers))


async def until(outputs: Outputs, check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await outputs.poll()
        if check():
            return True
    return False


async def trial(bootstrap: str, idempotent: bool) -> list[tuple[str, str]]:
    settings = KafkaSettings(
        bootstrap=bootstrap, topic_prefix=f"brokers-{uuid.uuid4().hex[:6]}.", idempotent_producer=idempotent
    )
    results: list[tuple[str, str]] = []

    async def step(name: str, action: Callable[[], Awaitable[bool]]) -> bool:
        try:
            ok = await action()
            results.append((name, "ok" if ok else "FAILED (condition not reached in time)"))
        except Exception as error:  # the point is to report what breaks
            results.append((name, f"BROKE: {type(error).__name__}: {error}"[:300]))
            traceback.print_exc(file=sys.stderr)
            ok = False
        return ok

    async def topics() -> bool:
        await ensure_topics(settings, ALL_TOPICS)
        return True

    if not await step("create topics (compacted ones included)", topics):
        return results
    producer = EventProducer(settings, "//kumiki/brokers")

    async def start_producer() -> bool:
        await producer.start()
        return True

    if not await step("bus EventProducer starts (acks=all, idempotence as asked)", start_producer):
        await producer.stop()
        return results
    outputs = Outputs(settings)
    await outputs.consumer.start()
    streams: TelemetryStreams | None = None
    sink: KafkaSink | None = None
    try:

        async def start_worker() -> bool:
            nonlocal streams
            streams = TelemetryStreams(settings, CONFIG, producer)
            await streams.start()
            await streams.wait_recovered(60)
            return True

        if not await step("faust worker starts, tables recovered", start_worker):
            return results
        inventory = GpuInventory(
            "node-a",
            time.time(),
            "550",
            "12.4",
            tuple(GpuDevice(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 80 * GIB, None, False) for i in range(2)),
        )

        async def jobs_and_samples() -> bool:
            nonlocal sink
            await producer.publish_many(
                JOB_LIFECYCLE,
                [
                    (
                        job,
                        events_pb2.JobLifecycle(
                            job=common_pb2.JobRef(job_id=job, generation=1),
                            queue="q",
                            state=events_pb2.JOB_STATE_RUNNING,
                            assignments=[common_pb2.PodAssignment(node="node-a", gpu_indices=[i])],
                        ),
                    )
                    for i, job in enumerate(("idle-job", "busy-job"))
                ],
            )
            sink = await KafkaSink.open(settings, source="//kumiki/brokers-agent")
            await sink.publish_inventory(inventory)
            return True

        if not await step("agent sink publishes inventory; job.lifecycle published", jobs_and_samples):
            return results

        async def feed(seconds: float) -> None:
            assert sink is not None
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                now = time.time()
                await sink.publish(
                    [
                        GpuSample("node-a", f"GPU-{i}", i, None, now, SampleFields(gpu_util_pct=util))
                        for i, util in ((0, 2.0), (1, 95.0))
                    ]
                )
                await asyncio.sleep(0.2)

        feeder = asyncio.create_task(feed(8.0))

        def state_ok() -> bool:
            states = [s for s in outputs.states if s.node == "node-a" and s.healthy]
            return (
                bool(states)
                and [round(g.utilization_pct) for g in states[-1].gpus] == [2, 95]
                and states[-1].labels.get("kumiki.dev/free-gpus") == ""
            )

        await step(
            "cluster.state: node-a healthy, utilisation 2/95, both GPUs held", lambda: until(outputs, state_ok, 30)
        )
        await step(
            "gpu.idle for idle-job",
            lambda: until(outputs, lambda: any(e.job.job_id == "idle-job" for e in outputs.idle), 30),
        )
        await feeder
        await step(
            "no gpu.idle for busy-job",
            lambda: until(outputs, lambda: not any(e.job.job_id == "busy-job" for e in outputs.idle), 1),
        )

        async def invalid() -> bool:
            bad = events_pb2.GpuSample(node="node-a", gpu_uuid="GPU-0", gpu_utilization_pct=150.0)
            bad.sampled_at.GetCurrentTime()
            await producer.publish(GPU_SAMPLES, "node-a/GPU-0", bad)
            return await until(
                outputs, lambda: any(b"0..100" in h.get("kumiki_dlq_reason", b"") for h in outputs.dead), 30
            )

        await step("invalid sample dead-lettered with the reason", invalid)
        await step(
            "silent node published unhealthy",
            lambda: until(outputs, lambda: not [s for s in outputs.states if s.node == "node-a"][-1].healthy, 30),
        )

        async def restart() -> bool:
            nonlocal streams
            assert streams is not None
            before = max(s.version.version for s in outputs.states if s.node == "node-a")
            tables = ("node_records", "job_placements", "node_windows")

            def contents(name: str) -> dict[str, object]:
                table = getattr(streams, name)
                items = table.table.items() if name == "node_windows" else table.items()
                return json.loads(json.dumps({str(k): v for k, v in items}, default=lambda o: o.__json__()))

            kept = {name: contents(name) for name in tables}
            await streams.stop()
            streams = TelemetryStreams(settings, CONFIG, producer)
            await streams.start()
            await streams.wait_recovered(60)
            back = {name: contents(name) for name in tables}
            for name in tables:
                if back[name] != kept[name]:
                    lost = [key for key in kept[name] if back[name].get(key) != kept[name][key]]
                    raise AssertionError(
                        f"table {name} recovered {len(back[name])} keys, {len(lost)} of "
                        f"{len(kept[name])} differ from before the restart"
                    )
            await feed(1.0)
            return await until(
                outputs,
                lambda: (
                    [s for s in outputs.states if s.node == "node-a"][-1].version.version > before
                    and [s for s in outputs.states if s.node == "node-a"][-1].healthy
                    and [s for s in outputs.states if s.node == "node-a"][-1].labels.get("kumiki.dev/free-gpus") == ""
                ),
                60,
            )

        await step(
            "restarted worker: every table equal to before the stop (changelog recovery), holders kept,"
            " version continues",
            restart,
        )
    finally:
        if streams is not None:
            await streams.stop()
        if sink is not None:
            await sink.close()
        await producer.stop()
        await outputs.consumer.stop()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", action="append", required=True, help="HOST:PORT (repeat for several)")
    parser.add_argument("--no-idempotence", action="store_true", help="producers without enable_idempotence")
    args = parser.parse_args()
    console = Console()
    for bootstrap in args.bootstrap:
        results = await trial(bootstrap, not args.no_idempotence)
        table = Table(title=f"telemetry worker on {bootstrap} (idempotent producer: {not args.no_idempotence})")
        table.add_column("step")
        table.add_column("result")
        for name, outcome in results:
            table.add_row(name, outcome)
        console.print(table)


if __name__ == "__main__":
    asyncio.run(main())
