"""End-to-end telemetry ingest throughput for one faust worker process, and the lag at that rate.

    python benchmarks/telemetry_ingest.py [--bootstrap HOST:PORT] [--nodes 100] [--gpus 8] [--ticks 250]
                                          [--live-rate 20000] [--live-s 15] [--plot docs/telemetry_ingest.png]

Without --bootstrap (or KUMIKI_KAFKA_BOOTSTRAP) it starts the development broker (noida-db). Phases, one run:
  1. agent sink   nodes x gpus x ticks GpuSamples through the agent's KafkaSink (one publish per node tick,
                  32 node agents concurrently) onto kumiki.gpu.samples;
  2. baselines    the same records read back by raw aiokafka (no decoding), then raw aiokafka + the bus codec's
                  decode() (CloudEvents headers, protobuf, validation);
  3. faust        a fresh TelemetryStreams worker (tables, windows, node state, cluster.state publishing) catches
                  up with the same backlog: samples/s until every sample is folded into node state;
  4. live         a separate producer process publishes at --live-rate while the worker runs: sample age at
                  ingest (p50/p99 of each batch's oldest sample) and the backlog when the producer stops.
The target is >= 20,000 samples/s per worker.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import broker
from aiokafka import AIOKafkaConsumer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kumiki.agent.adapters.kafka import KafkaSink
from kumiki.agent.core import GpuDevice, GpuInventory, GpuSample, SampleFields
from kumiki.common.bus import EventProducer, decode, ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS, GPU_SAMPLES
from kumiki.common.config import KafkaSettings
from kumiki.telemetry.adapters.streams import TelemetryStreams
from kumiki.telemetry.core import TelemetryConfig
from kumiki.telemetry.topics import NODE_INVENTORY

TARGET = 20_000
GIB = 1024**3


def node_tick(node: int, gpus: int, timestamp: float) -> list[GpuSample]:
    return [
        GpuSample(f"node-{node:04d}", f"GPU-{node:04d}-{g}", g, None, timestamp,
                  SampleFields(gpu_util_pct=float((node * 7 + g * 13) % 100), memory_util_pct=10.0,
                               memory_used_bytes=GIB * (g + 1), memory_total_bytes=80 * GIB, power_w=250.0,
                               temperature_c=50.0, ecc_corrected_volatile=0, ecc_uncorrected_volatile=0),
                  model="NVIDIA A100-SXM4-80GB", source="nvml")
        for g in range(gpus)
    ]


def node_inventory(node: int, gpus: int) -> GpuInventory:
    """What each simulated agent publishes before its first sample (telemetry rejects unregistered nodes)."""
    return GpuInventory(f"node-{node:04d}", time.time(), "550.54.15", "12.4", tuple(
        GpuDevice(g, f"GPU-{node:04d}-{g}", "NVIDIA A100-SXM4-80GB", 80 * GIB, None, False) for g in range(gpus)))


async def register(sink: KafkaSink, nodes: range, gpus: int) -> None:
    for start in range(0, len(nodes), 256):
        await asyncio.gather(*(sink.publish_inventory(node_inventory(node, gpus))
                               for node in nodes[start:start + 256]))


async def agent_phase(settings: KafkaSettings, nodes: int, gpus: int, ticks: int, progress: Progress) -> float:
    """Seconds to publish every sample through the agent's sink (32 agents' worth of concurrency)."""
    sink = await KafkaSink.open(settings, source="//kumiki/bench")
    await register(sink, range(nodes), gpus)
    task = progress.add_task("agent sink → broker", total=nodes * gpus * ticks)
    base = time.time() - ticks
    queue: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
    for tick in range(ticks):
        for node in range(nodes):
            queue.put_nowait((node, tick))

    async def agent() -> None:
        while not queue.empty():
            node, tick = queue.get_nowait()  # type: ignore[misc]
            await sink.publish(node_tick(node, gpus, base + tick))
            progress.advance(task, gpus)

    started = time.perf_counter()
    await asyncio.gather(*(agent() for _ in range(32)))
    elapsed = time.perf_counter() - started
    await sink.close()
    return elapsed


async def raw_phase(settings: KafkaSettings, total: int, with_decode: bool) -> float:
    topic = GPU_SAMPLES.full_name(settings.topic_prefix)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.bootstrap, group_id=f"raw-{uuid.uuid4().hex[:6]}",
                                enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=2000)
    await consumer.start()
    seen = 0
    started = time.perf_counter()
    while seen < total:
        for records in (await consumer.getmany(timeout_ms=500)).values():
            if with_decode:
                for record in records:
                    decode(GPU_SAMPLES, record.key, record.value, list(record.headers))
            seen += len(records)
    elapsed = time.perf_counter() - started
    await consumer.stop()
    return elapsed


async def faust_phase(
    settings: KafkaSettings, total: int, progress: Progress, front_end: str
) -> tuple[float, float, TelemetryStreams]:
    """Wall seconds and CPU seconds of this process until every sample is folded into node state."""
    async with EventProducer(settings, "//kumiki/bench-telemetry") as producer:
        streams = TelemetryStreams(settings, TelemetryConfig(), producer, front_end=front_end,
                                   name=f"telemetry-{front_end}")
        await streams.start()
        task = progress.add_task(f"worker, {front_end} front end", total=total)
        cpu_started = time.process_time()
        first: float | None = None
        while streams.samples_applied < total:
            await asyncio.sleep(0.05)
            if first is None and streams.samples_seen > 0:
                first = time.perf_counter()
            progress.update(task, completed=streams.samples_applied)
        elapsed = time.perf_counter() - (first or time.perf_counter())
        cpu = time.process_time() - cpu_started
        await streams.stop()
        return elapsed, cpu, streams


def live_producer(
    bootstrap: str, prefix: str, rate: int, seconds: float, gpus: int, done: Any
) -> None:
    """A separate process: node agents publishing at `rate` samples/s with current timestamps."""

    async def run() -> None:
        settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix)
        sink = await KafkaSink.open(settings, source="//kumiki/bench-live")
        nodes = max(1, rate // gpus)  # each node ticks once a second, spread over the second
        slices = 20
        started = time.perf_counter()
        sent = 0
        step = 0
        while time.perf_counter() - started < seconds:
            now = time.time()
            group = range(step % slices, nodes, slices)
            await asyncio.gather(*(sink.publish(node_tick(node, gpus, now)) for node in group))
            sent += gpus * len(group)
            step += 1
            await asyncio.sleep(max(0.0, started + step / slices - time.perf_counter()))
        done.value = sent
        await sink.close()

    asyncio.run(run())


async def live_phase(settings: KafkaSettings, rate: int, seconds: float, gpus: int) -> dict[str, float]:
    prefix = f"bench-live-{uuid.uuid4().hex[:6]}."
    live = KafkaSettings(bootstrap=settings.bootstrap, topic_prefix=prefix)
    await ensure_topics(live, [*ALL_TOPICS, NODE_INVENTORY])
    async with EventProducer(live, "//kumiki/bench-telemetry") as producer:
        streams = TelemetryStreams(live, TelemetryConfig(), producer, name="telemetry-live")
        await streams.start()
        try:
            await streams.wait_recovered(60)
            context = multiprocessing.get_context("spawn")
            sent = context.Value("q", -1)
            process = context.Process(target=live_producer,
                                      args=(settings.bootstrap, prefix, rate, seconds, gpus, sent))
            process.start()
            while process.is_alive():
                await asyncio.sleep(0.1)
            if sent.value < 0:
                raise RuntimeError(f"live producer failed (exit code {process.exitcode})")
            stopped = time.perf_counter()
            backlog_at_stop = max(0, sent.value - streams.samples_applied)
            while streams.samples_applied < sent.value:
                await asyncio.sleep(0.02)
            drained_s = time.perf_counter() - stopped
        finally:
            await streams.stop()
    return {"sent": float(sent.value), "backlog_at_stop": float(backlog_at_stop), "drain_s": drained_s,
            "rate": sent.value / seconds}


def histogram_counts(histogram: Any) -> dict[float, float]:
    return {float(sample.labels["le"]): sample.value for metric in histogram.collect() for sample in metric.samples
            if sample.name.endswith("_bucket")}


def quantile(before: dict[float, float], after: dict[float, float], level: float) -> float:
    """Upper bucket bound holding the `level` quantile of what was observed between the two snapshots."""
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0.0)
    for bound in bounds:
        if after[bound] - before.get(bound, 0.0) >= level * total and total > 0:
            return bound
    return float("nan")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"))
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=250)
    parser.add_argument("--live-rate", type=int, default=TARGET)
    parser.add_argument("--live-s", type=float, default=15.0)
    parser.add_argument("--plot", default=None, help="write a PNG bar chart of the rates here")
    args = parser.parse_args()
    for name in ("nodes", "gpus", "ticks", "live_rate"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: must be > 0")
    console = Console()
    total = args.nodes * args.gpus * args.ticks
    with broker(args.bootstrap) as bootstrap:
        settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-tel-{uuid.uuid4().hex[:6]}.")
        await ensure_topics(settings, [*ALL_TOPICS, NODE_INVENTORY])
        with Progress(console=console, transient=True) as progress:
            produce_s = await agent_phase(settings, args.nodes, args.gpus, args.ticks, progress)
            console.log(f"agent sink: {total / produce_s:,.0f} samples/s")
            raw_s = await raw_phase(settings, total, with_decode=False)
            console.log(f"raw consume: {total / raw_s:,.0f} samples/s")
            decode_s = await raw_phase(settings, total, with_decode=True)
            console.log(f"raw consume + decode: {total / decode_s:,.0f} samples/s")
            faust_only_s, _, _ = await faust_phase(settings, total, progress, "faust")
            console.log(f"faust agents only: {total / faust_only_s:,.0f} samples/s")
            faust_s, cpu_s, streams = await faust_phase(settings, total, progress, "aiokafka")
            console.log(f"worker: {total / faust_s:,.0f} samples/s")
        states = streams.published_states
        from kumiki.telemetry.adapters import metrics

        ingest_before = histogram_counts(metrics.SAMPLE_LAG_SECONDS)
        state_before = histogram_counts(metrics.STATE_LAG_SECONDS)
        live = await live_phase(settings, args.live_rate, args.live_s, args.gpus)
        ingest_after = histogram_counts(metrics.SAMPLE_LAG_SECONDS)
        state_after = histogram_counts(metrics.STATE_LAG_SECONDS)
        lags = {name: (quantile(before, after, 0.5), quantile(before, after, 0.99))
                for name, before, after in (("ingest", ingest_before, ingest_after),
                                            ("state", state_before, state_after))}

    rates = {
        "agent sink → broker": total / produce_s,
        "raw aiokafka consume (baseline)": total / raw_s,
        "raw aiokafka + bus decode()": total / decode_s,
        "worker, faust stream front end": total / faust_only_s,
        "worker, aiokafka front end + faust (default)": total / faust_s,
    }
    table = Table(title=f"telemetry ingest, {total:,} samples ({args.nodes} nodes x {args.gpus} GPUs x "
                        f"{args.ticks} ticks), broker {bootstrap}")
    table.add_column("path")
    table.add_column("samples/s", justify="right")
    table.add_column("vs raw consume", justify="right")
    for name, rate in rates.items():
        table.add_row(name, f"{rate:,.0f}", f"{rate / rates['raw aiokafka consume (baseline)']:.2f}x")
    console.print(table)
    faust_rate = rates["worker, aiokafka front end + faust (default)"]
    verdict = "MET" if faust_rate >= TARGET else "MISSED"
    console.print(f"target >= {TARGET:,} samples/s per worker: {verdict} ({faust_rate:,.0f}/s); "
                  f"cluster.state records published during catch-up: {states}; worker CPU {cpu_s:.1f}s "
                  f"= {total / cpu_s:,.0f} samples per CPU-second")
    console.print(
        f"live, {live['rate']:,.0f} samples/s offered for {args.live_s:g}s by a separate producer process: "
        f"oldest sample of a batch at ingest p50 <= {lags['ingest'][0]:g}s, p99 <= {lags['ingest'][1]:g}s; "
        f"newest sample of a chunk when folded into node state p50 <= {lags['state'][0]:g}s, "
        f"p99 <= {lags['state'][1]:g}s (histogram bucket bounds); not yet in node state when the producer "
        f"stopped: {live['backlog_at_stop']:,.0f} samples, drained {live['drain_s']:.2f}s later")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker

        figure, axis = plt.subplots(figsize=(8, 3.5))
        axis.barh(list(rates), list(rates.values()), color=["#888", "#4a7", "#4a7", "#c84", "#37c"])
        axis.axvline(TARGET, color="red", linestyle="--", label=f"target {TARGET:,}/s")
        axis.set_xscale("log")
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
        axis.set_xlabel("samples/s (one process, log scale)")
        axis.invert_yaxis()
        axis.legend()
        figure.tight_layout()
        figure.savefig(args.plot, dpi=120)
        console.print(f"plot: {args.plot}")


if __name__ == "__main__":
    asyncio.run(main())
