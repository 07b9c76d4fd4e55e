"""End-to-end telemetry ingest throughput for one faust worker process, and the lag at that rate.

    python benchmarks/telemetry_ingest.py [--bootstrap HOST:PORT] [--nodes 100] [--gpus 8] [--ticks 250]
        [--phases catch-up,live] [--live-rates 20000] [--repeat 1] [--live-s 15] [--producers 1]
        [--batch-window-s 0.25[,2]] [--plot docs/telemetry_ingest.png]

Without --bootstrap (or KUMIKI_KAFKA_BOOTSTRAP) it starts the development broker (noida-db). Phases:
  catch-up  every node's inventory, then nodes x gpus x ticks GpuSamples through the agent's KafkaSink (one
            publish per node tick, 32 node agents concurrently) onto kumiki.gpu.samples; the same records read
            back by raw aiokafka (the baseline), raw aiokafka + the bus codec's decode(), and then a fresh
            TelemetryStreams worker (tables, windows, node state, cluster.state publishing), with the faust
            stream front end and with the default aiokafka one: samples/s until every sample is folded into
            node state;
  live      separate producer processes (node agents: inventory first, then one KafkaSink.publish per node
            tick at 1 Hz with current timestamps) offer each --live-rates rate for --live-s seconds while a
            worker with each --batch-window-s follows: the age of every sample when its chunk is folded into
            node state (p50/p99/max), the worker's CPU and its wait for a CPU, and the backlog at the stop.
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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _support import broker, percentile, ratio_table, raw_consumer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kumiki.agent.adapters.kafka import KafkaSink
from kumiki.agent.core import GpuDevice, GpuInventory, GpuSample, SampleFields
from kumiki.common.bus import EventProducer, decode, ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS, GPU_SAMPLES
from kumiki.common.config import KafkaSettings
from kumiki.telemetry.adapters.gc_policy import TimedCollection
from kumiki.telemetry.adapters.streams import TelemetryStreams
from kumiki.telemetry.core import TelemetryConfig

TARGET = 20_000
GIB = 1024**3


def node_tick(node: int, gpus: int, timestamp: float) -> list[GpuSample]:
    return [
        GpuSample(
            f"node-{node:04d}",
            f"GPU-{node:04d}-{g}",
            g,
            None,
            timestamp,
            SampleFields(
                gpu_util_pct=float((node * 7 + g * 13) % 100),
                memory_util_pct=10.0,
                memory_used_bytes=GIB * (g + 1),
                memory_total_bytes=80 * GIB,
                power_w=250.0,
                temperature_c=50.0,
                ecc_corrected_volatile=0,
                ecc_uncorrected_volatile=0,
            ),
            model="NVIDIA A100-SXM4-80GB",
            source="nvml",
        )
        for g in range(gpus)
    ]


def node_inventory(node: int, gpus: int) -> GpuInventory:
    """What each simulated agent publishes before its first sample (telemetry rejects unregistered nodes)."""
    return GpuInventory(
        f"node-{node:04d}",
        time.time(),
        "550.54.15",
        "12.4",
        tuple(GpuDevice(g, f"GPU-{node:04d}-{g}", "NVIDIA A100-SXM4-80GB", 80 * GIB, None, False) for g in range(gpus)),
    )


async def register(sink: KafkaSink, nodes: Sequence[int], gpus: int) -> None:
    for start in range(0, len(nodes), 256):
        await asyncio.gather(
            *(sink.publish_inventory(node_inventory(node, gpus)) for node in nodes[start : start + 256])
        )


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
    consumer = raw_consumer(settings.bootstrap, topic, max_poll_records=2000)
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
        streams = TelemetryStreams(
            settings, TelemetryConfig(), producer, front_end=front_end, name=f"telemetry-{front_end}"
        )
        await streams.start()
        await streams.wait_recovered(60)
        collection = TimedCollection()  # as the service runs its worker (kumiki.telemetry.app)
        collection.start()
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
        await collection.stop()
        await streams.stop()
        return elapsed, cpu, streams


def live_producer(
    bootstrap: str, prefix: str, nodes: list[int], seconds: float, gpus: int, ready: Any, go: Any, done: Any
) -> None:
    """A separate process: node agents (each its own inventory, then one KafkaSink.publish per tick, 1 Hz,
    spread over the second) publishing samples with current timestamps."""

    async def run() -> None:
        settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=prefix)
        sink = await KafkaSink.open(settings, source="//kumiki/bench-live")
        await register(sink, nodes, gpus)
        ready.set()
        go.wait()
        slices = 20
        started = time.perf_counter()
        sent = 0
        step = 0
        while time.perf_counter() - started < seconds:
            now = time.time()
            group = nodes[step % slices :: slices]
            await asyncio.gather(*(sink.publish(node_tick(node, gpus, now)) for node in group))
            sent += gpus * len(group)
            step += 1
            await asyncio.sleep(max(0.0, started + step / slices - time.perf_counter()))
        done.value = sent
        await sink.close()

    asyncio.run(run())


def run_queue_wait_s() -> float:
    """Seconds this process was runnable but waiting for a CPU (Linux schedstat): on a shared machine, what
    separates "too slow" from "not given the CPU"."""
    try:
        with open("/proc/self/schedstat") as stats:
            return int(stats.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


class MeasuredStreams(TelemetryStreams):
    """The worker as it is, plus the age of every sample when its chunk is folded into node state (the
    metric keeps each chunk's newest only, in histogram buckets): samples of a GPU in one chunk are taken as
    evenly spaced between its first and last timestamp."""

    ages: list[float]

    def _chunk_metrics(self, chunk: Any, now: float) -> None:
        super()._chunk_metrics(chunk, now)
        for gpu in chunk.gpus.values():
            if gpu.samples == 1:
                self.ages.append(now - gpu.last_ts)
            else:
                step = (gpu.last_ts - gpu.first_ts) / (gpu.samples - 1)
                self.ages.extend(now - gpu.first_ts - i * step for i in range(gpu.samples))


async def live_phase(
    settings: KafkaSettings, rate: int, seconds: float, gpus: int, producers: int, config: TelemetryConfig
) -> dict[str, float]:
    prefix = f"bench-live-{uuid.uuid4().hex[:6]}."
    live = KafkaSettings(bootstrap=settings.bootstrap, topic_prefix=prefix)
    await ensure_topics(live, ALL_TOPICS)
    nodes = list(range(max(1, rate // gpus)))  # each node ticks once a second
    async with EventProducer(live, "//kumiki/bench-telemetry") as producer:
        streams = MeasuredStreams(live, config, producer, name="telemetry-live")
        streams.ages = []
        await streams.start()
        collection = TimedCollection()  # as the service runs its worker (kumiki.telemetry.app)
        try:
            await streams.wait_recovered(60)
            collection.start()
            context = multiprocessing.get_context("spawn")
            go = context.Event()
            shares = [(nodes[i::producers], context.Event(), context.Value("q", -1)) for i in range(producers)]
            processes = [
                context.Process(
                    target=live_producer, args=(settings.bootstrap, prefix, share, seconds, gpus, ready, go, sent)
                )
                for share, ready, sent in shares
            ]
            for process in processes:
                process.start()
            while not all(ready.is_set() for _, ready, _ in shares):  # inventories published
                if not all(process.is_alive() for process in processes):
                    raise RuntimeError("live producer failed before it started")
                await asyncio.sleep(0.1)
            while streams.known_nodes.registry.__len__() < len(nodes):
                await streams.known_nodes.catch_up()
            cpu_started = time.process_time()
            wait_started = run_queue_wait_s()
            go.set()
            while any(process.is_alive() for process in processes):
                await asyncio.sleep(0.1)
            if any(sent.value < 0 for _, _, sent in shares):
                raise RuntimeError(f"live producer failed (exit codes {[p.exitcode for p in processes]})")
            total = sum(sent.value for _, _, sent in shares)
            stopped = time.perf_counter()
            backlog_at_stop = max(0, total - streams.samples_applied)
            while streams.samples_applied < total:
                await asyncio.sleep(0.02)
            drained_s = time.perf_counter() - stopped
            cpu_s = time.process_time() - cpu_started
            queue_wait_s = run_queue_wait_s() - wait_started
        finally:
            await collection.stop()
            await streams.stop()
    ages = sorted(streams.ages)
    return {
        "sent": float(total),
        "backlog_at_stop": float(backlog_at_stop),
        "drain_s": drained_s,
        "rate": total / seconds,
        "offered": float(len(nodes) * gpus),
        "cpu_s": cpu_s,
        "queue_wait_s": queue_wait_s,
        "flow_waits": float(streams.flow_waits),
        "window": config.batch_window_s,
        "p50": percentile(ages, 50),
        "p99": percentile(ages, 99),
        "max": ages[-1] if ages else float("nan"),
    }


def sustained(live: dict[str, float]) -> bool:
    """Kept up: the producer sent what was asked, and at its stop at most one stage-1 window plus one second
    of samples was not yet in node state, and it was folded within the window plus two seconds."""
    return (
        live["rate"] >= 0.95 * live["offered"]
        and live["backlog_at_stop"] <= live["offered"] * (live["window"] + 1.0)
        and live["drain_s"] <= live["window"] + 2.0
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"))
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=250)
    parser.add_argument("--phases", default="catch-up,live", help="comma-separated: catch-up, live")
    parser.add_argument("--live-rates", default=str(TARGET), help="comma-separated samples/s offered live")
    parser.add_argument("--live-s", type=float, default=15.0)
    parser.add_argument("--repeat", type=int, default=1, help="live runs per rate")
    parser.add_argument("--producers", type=int, default=1, help="live producer processes (nodes split)")
    parser.add_argument(
        "--batch-window-s",
        default=str(TelemetryConfig.batch_window_s),
        help="comma-separated stage-1 windows; each live rate runs with each",
    )
    parser.add_argument("--plot", default=None, help="write a PNG chart of the rates and live lag here")
    args = parser.parse_args()
    phases = {phase.strip() for phase in args.phases.split(",") if phase.strip()}
    if not phases or phases - {"catch-up", "live"}:
        parser.error(f"--phases: expected catch-up and/or live, got {args.phases!r}")
    try:
        live_rates = [int(rate) for rate in args.live_rates.split(",")]
    except ValueError:
        parser.error(f"--live-rates: expected comma-separated integers, got {args.live_rates!r}")
    try:
        windows = [float(window) for window in args.batch_window_s.split(",")]
    except ValueError:
        parser.error(f"--batch-window-s: expected comma-separated numbers, got {args.batch_window_s!r}")
    if any(not 0.01 <= window <= 10 for window in windows):
        parser.error("--batch-window-s: every window must be within 0.01..10")
    for name in ("nodes", "gpus", "ticks", "repeat", "producers", "live_s"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')}: must be > 0")
    if any(rate <= 0 for rate in live_rates):
        parser.error("--live-rates: every rate must be > 0")
    console = Console()
    total = args.nodes * args.gpus * args.ticks
    rates: dict[str, float] = {}
    lives: list[dict[str, float]] = []
    with broker(args.bootstrap) as bootstrap:
        settings = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-tel-{uuid.uuid4().hex[:6]}.")
        await ensure_topics(settings, ALL_TOPICS)
        if "catch-up" in phases:
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
            rates = {
                "agent sink → broker": total / produce_s,
                "raw aiokafka consume (baseline)": total / raw_s,
                "raw aiokafka + bus decode()": total / decode_s,
                "worker, faust stream front end": total / faust_only_s,
                "worker, aiokafka front end + faust (default)": total / faust_s,
            }
            title = (
                f"catch-up, {total:,} samples ({args.nodes} nodes x {args.gpus} GPUs x {args.ticks} ticks), "
                f"broker {bootstrap}"
            )
            headers = ("path", "samples/s", "vs raw consume")
            console.print(ratio_table(title, headers, rates, "raw aiokafka consume (baseline)", ",.0f"))
            faust_rate = rates["worker, aiokafka front end + faust (default)"]
            verdict = "MET" if faust_rate >= TARGET else "MISSED"
            console.print(
                f"catch-up target >= {TARGET:,} samples/s per worker: {verdict} ({faust_rate:,.0f}/s); "
                f"cluster.state records published: {streams.published_states}; worker CPU "
                f"{cpu_s:.1f}s = {total / cpu_s:,.0f} samples per CPU-second"
            )
        if "live" in phases:
            for window, rate in ((window, rate) for window in windows for rate in live_rates):
                for run in range(args.repeat):
                    config = TelemetryConfig(batch_window_s=window)
                    live = await live_phase(settings, rate, args.live_s, args.gpus, args.producers, config)
                    lives.append(live)
                    console.log(
                        f"live {rate:,}/s window {window:g}s run {run + 1}: sent {live['rate']:,.0f}/s, "
                        f"age p50 "
                        f"{live['p50']:.2f}s p99 {live['p99']:.2f}s, worker CPU "
                        f"{live['cpu_s'] / live['sent'] * 1e6:.0f} µs a sample, backlog at stop "
                        f"{live['backlog_at_stop']:,.0f}, drained {live['drain_s']:.2f}s"
                    )
    if lives:
        table = Table(
            title=f"live: {args.producers} producer process(es), nodes of {args.gpus} GPUs at 1 Hz, "
            f"{args.live_s:g}s each"
        )
        for column in (
            "window",
            "offered/s",
            "sent/s",
            "worker CPU",
            "CPU a sample",
            "worker waiting for a CPU",
            "age in node state p50 / p99 / max",
            "not in state at stop",
            "drained after",
            "kept up",
        ):
            table.add_column(column, justify="right")
        for live in lives:
            table.add_row(
                f"{live['window']:g} s",
                f"{live['offered']:,.0f}",
                f"{live['rate']:,.0f}",
                f"{live['cpu_s'] / (args.live_s + live['drain_s']):.0%} of a core",
                f"{live['cpu_s'] / live['sent'] * 1e6:.0f} µs",
                f"{live['queue_wait_s'] / (args.live_s + live['drain_s']):.0%} of the time",
                f"{live['p50']:.2f} / {live['p99']:.2f} / {live['max']:.2f} s",
                f"{live['backlog_at_stop']:,.0f}",
                f"{live['drain_s']:.2f} s",
                "yes" if sustained(live) else "NO",
            )
        console.print(table)
        kept = [live for live in lives if sustained(live)]
        best = max((live["offered"] for live in kept), default=0.0)
        console.print(
            f"live target {TARGET:,}/s: {'MET' if best >= TARGET else 'MISSED'}; highest rate kept up: "
            f"{best:,.0f}/s (age = now - sampled_at when the sample's chunk is folded into node state)"
        )
    if args.plot:
        plot(args.plot, rates, lives)
        console.print(f"plot: {args.plot}")


def plot(path: str, rates: dict[str, float], lives: list[dict[str, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    panels = int(bool(rates)) + int(bool(lives))
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3.5 * panels), squeeze=False)
    axis_iter = iter(axes[:, 0])
    if rates:
        axis = next(axis_iter)
        axis.barh(list(rates), list(rates.values()), color=["#888", "#4a7", "#4a7", "#c84", "#37c"])
        axis.axvline(TARGET, color="red", linestyle="--", label=f"target {TARGET:,}/s")
        axis.set_xscale("log")
        axis.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:,.0f}"))
        axis.set_xlabel("catch-up samples/s (one process, log scale)")
        axis.invert_yaxis()
        axis.legend()
    if lives:
        axis = next(axis_iter)
        colours = ["#37c", "#c84", "#4a7", "#a4c"]
        for n, window in enumerate(sorted({live["window"] for live in lives})):
            colour = colours[n % len(colours)]
            for kept in (True, False):
                runs = [live for live in lives if live["window"] == window and sustained(live) == kept]
                if not runs:
                    continue
                label = f"window {window:g}s" + ("" if kept else ", fell behind")
                fill = colour if kept else "none"
                for quantile, marker in (("p50", "o"), ("p99", "^")):
                    axis.scatter(
                        [live["rate"] for live in runs],
                        [live[quantile] for live in runs],
                        marker=marker,
                        edgecolors=colour,
                        facecolors=fill,
                        label=f"{quantile}, {label}",
                    )
        axis.axvline(TARGET, color="red", linestyle="--", label=f"target {TARGET:,}/s")
        axis.set_yscale("log")
        axis.set_xlim(left=0, right=TARGET * 1.1)
        axis.set_xlabel("live samples/s the producer process sent (up to 20,000 offered)")
        axis.set_ylabel("sample age in node state (s)")
        axis.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    asyncio.run(main())
