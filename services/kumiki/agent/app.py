"""The node agent process: options, source and sink wiring, the sampling loop, record and replay.

    python -m kumiki.agent --node NAME --interval-s 1 --output -         # JSON lines on stdout
    python -m kumiki.agent --node NAME --record DIR --duration-s 60       # keep a fixture
    python -m kumiki.agent --replay DIR --output -                        # play it back
    python -m kumiki.agent --node NAME --source dcgm --dcgm-url http://localhost:9400/metrics

Meant to run as a DaemonSet: the node name comes from KUMIKI_NODE_NAME (downward API) when --node
is not given. SIGTERM ends the run cleanly after the tick in progress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from kumiki.agent.core import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    GpuInventory,
    GpuSample,
    InventorySink,
    RecordError,
    SampleSink,
    TickSchedule,
    group_by_timestamp,
    inventory_changes,
    node_name_error,
)
from kumiki.common.bus.admin import BrokerUnavailable
from kumiki.common.token_file import TokenFile

log = logging.getLogger("kumiki.agent")

SOURCES = ("nvml", "dcgm")


class ConfigError(ValueError):
    """A bad option; printed as one line naming it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option


@dataclass(frozen=True)
class AgentConfig:
    node: str | None
    source: str
    interval_s: float
    duration_s: float | None
    output: str | None
    record_dir: Path | None
    replay_dir: Path | None
    dcgm_url: str
    speed: float
    keep_timestamps: bool
    log_level: str
    metrics_port: int | None = None  # serve /metrics on this port (KUMIKI_AGENT_METRICS_PORT)
    metrics_host: str = "127.0.0.1"
    inventory_interval_s: float = 60.0  # read the inventory again this often (MIG layout changes); 0: never
    token_file: Path | None = None  # the pod's projected token, sent with every record (telemetry's proof of node)
    node_key_file: Path | None = None  # this node's key, which signs every record (the same, outside Kubernetes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kumiki.agent",
        description="Kumiki node agent: GPU inventory and samples from NVML or dcgm-exporter.",
    )
    parser.add_argument(
        "--node", default=os.environ.get("KUMIKI_NODE_NAME"), help="Kubernetes node name (default: $KUMIKI_NODE_NAME)"
    )
    parser.add_argument(
        "--source",
        default=os.environ.get("KUMIKI_AGENT_SOURCE", "nvml"),
        help="nvml (pynvml, default) or dcgm (scrape dcgm-exporter)",
    )
    parser.add_argument(
        "--interval-s",
        default=os.environ.get("KUMIKI_AGENT_INTERVAL_S", "1"),
        help=f"seconds between samples, {MIN_INTERVAL_S}..{MAX_INTERVAL_S} (default 1)",
    )
    parser.add_argument("--duration-s", default=None, help="stop after this many seconds (default: run)")
    parser.add_argument(
        "--inventory-interval-s",
        default=os.environ.get("KUMIKI_AGENT_INVENTORY_INTERVAL_S", "60"),
        help="read the GPUs' inventory again this often and publish it when it changed, as after a MIG"
        " reconfiguration (default 60; 0: only at start)",
    )
    parser.add_argument(
        "--output", default=None, help="JSON-lines target: '-' for stdout or a file (default '-' unless --record)"
    )
    parser.add_argument(
        "--record", default=None, metavar="DIR", help="record inventory + samples into DIR (a replayable fixture)"
    )
    parser.add_argument("--replay", default=None, metavar="DIR", help="replay a recording from DIR")
    parser.add_argument(
        "--speed", default="1", help="replay speed factor; 0 replays as fast as the sink takes it (default 1)"
    )
    parser.add_argument(
        "--keep-timestamps",
        action="store_true",
        help="replay with the recorded timestamps instead of shifting them to now",
    )
    parser.add_argument(
        "--dcgm-url",
        default=os.environ.get("KUMIKI_DCGM_URL", "http://localhost:9400/metrics"),
        help="dcgm-exporter metrics URL (default http://localhost:9400/metrics)",
    )
    parser.add_argument(
        "--metrics-port",
        default=os.environ.get("KUMIKI_AGENT_METRICS_PORT"),
        help="serve Prometheus /metrics on this port, 1..65535 (default: $KUMIKI_AGENT_METRICS_PORT, else off)",
    )
    parser.add_argument(
        "--metrics-host",
        default=os.environ.get("KUMIKI_BIND_HOST", "127.0.0.1"),
        help="address of the /metrics server (default: $KUMIKI_BIND_HOST or 127.0.0.1; 0.0.0.0 in a pod)",
    )
    parser.add_argument(
        "--token-file",
        default=os.environ.get("KUMIKI_AGENT_TOKEN_FILE") or None,
        metavar="FILE",
        help="this pod's projected ServiceAccount token, sent with every record so that telemetry ingest can check"
        " the node it names (default: $KUMIKI_AGENT_TOKEN_FILE; read again when the kubelet rotates it)",
    )
    parser.add_argument(
        "--node-key-file",
        default=os.environ.get("KUMIKI_AGENT_NODE_KEY_FILE") or None,
        metavar="FILE",
        help="this node's key (kumiki telemetry node-key), which signs every record so that telemetry ingest can"
        " check the node it names, for agents outside Kubernetes (default: $KUMIKI_AGENT_NODE_KEY_FILE)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("KUMIKI_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR (default: $KUMIKI_LOG_LEVEL or INFO)",
    )
    return parser


def _number(option: str, text: str, *, low: float, high: float, low_open: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(option, f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
        bound = f"({low}" if low_open else f"[{low}"
        raise ConfigError(option, f"{text} is outside {bound}, {high}]")
    return value


def _proof_file(option: str, value: str | None, output: str | None, read: Callable[[Path], object]) -> Path | None:
    """A file that proves the node to telemetry (a token or a node key), checked readable by `read` now."""
    if not value:
        return None
    if output != "kafka":
        raise ConfigError(option, "only with --output kafka (it proves the node to telemetry ingest)")
    try:
        read(Path(value))
    except ValueError as error:
        raise ConfigError(option, str(error).removeprefix(f"{option}: ")) from None
    return Path(value)


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    """Validate every option, naming the first that is wrong."""
    replay_dir = Path(args.replay) if args.replay else None
    record_dir = Path(args.record) if args.record else None
    if replay_dir is not None:
        if record_dir is not None:
            raise ConfigError("--record", "cannot be combined with --replay (copy the folder instead)")
        if not replay_dir.is_dir():
            raise ConfigError("--replay", f"{replay_dir} is not a folder")
    if args.node is not None or replay_dir is None:
        if args.node is None:
            raise ConfigError("--node", "required (or set KUMIKI_NODE_NAME)")
        problem = node_name_error(args.node)
        if problem:
            raise ConfigError("--node", problem)
    source = args.source
    if source not in SOURCES:
        raise ConfigError("--source", f"{source!r} is not one of {', '.join(SOURCES)}")
    interval = _number("--interval-s", str(args.interval_s), low=MIN_INTERVAL_S, high=MAX_INTERVAL_S)
    duration = None
    if args.duration_s is not None:
        duration = _number("--duration-s", str(args.duration_s), low=0, high=366 * 86400, low_open=True)
    speed = _number("--speed", str(args.speed), low=0, high=1e6)
    inventory_interval = _number("--inventory-interval-s", str(args.inventory_interval_s), low=0, high=86400)
    if 0 < inventory_interval < interval:
        raise ConfigError("--inventory-interval-s", f"{inventory_interval:g} is shorter than --interval-s {interval:g}")
    if source == "dcgm" and replay_dir is None:
        from kumiki.agent.adapters.dcgm import url_error

        problem = url_error(args.dcgm_url)
        if problem:
            raise ConfigError("--dcgm-url", problem)
    if record_dir is not None and record_dir.exists() and not record_dir.is_dir():
        raise ConfigError("--record", f"{record_dir} exists and is not a folder")
    if record_dir is not None and (record_dir / "inventory.json").exists():
        raise ConfigError("--record", f"{record_dir} already holds a recording")
    if args.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError("--log-level", f"{args.log_level!r} is not DEBUG, INFO, WARNING or ERROR")
    metrics_port = None
    if args.metrics_port not in (None, ""):
        metrics_port = int(_number("--metrics-port", str(args.metrics_port), low=1, high=65535))
        if str(metrics_port) != str(args.metrics_port).strip():
            raise ConfigError("--metrics-port", f"{args.metrics_port!r} is not a whole number")
    output = args.output
    from kumiki.agent.adapters.kafka import read_node_key

    if args.token_file and args.node_key_file:
        raise ConfigError("--node-key-file", "give --token-file (on Kubernetes) or --node-key-file, not both")
    token_file = _proof_file("--token-file", args.token_file, output, lambda path: TokenFile(path, "--token-file"))
    node_key_file = _proof_file("--node-key-file", args.node_key_file, output, read_node_key)
    if output not in (None, "-") and not Path(output).parent.is_dir():
        raise ConfigError("--output", f"folder {Path(output).parent} does not exist")
    if output is None and record_dir is None:
        output = "-"
    return AgentConfig(
        node=args.node,
        source=source,
        interval_s=interval,
        duration_s=duration,
        output=output,
        record_dir=record_dir,
        replay_dir=replay_dir,
        dcgm_url=args.dcgm_url,
        speed=speed,
        keep_timestamps=args.keep_timestamps,
        log_level=args.log_level.upper(),
        metrics_port=metrics_port,
        metrics_host=args.metrics_host,
        inventory_interval_s=inventory_interval,
        token_file=token_file,
        node_key_file=node_key_file,
    )


# --------------------------------------------------------------------------------------------------
# Sources as the loop sees them


class Source(Protocol):
    errors: Counter[str]
    unsupported: set[tuple[int, str]]

    async def open(self, now: float) -> GpuInventory: ...

    async def reopen(self, now: float) -> GpuInventory:
        """Read the inventory again from scratch (and sample from it from now on)."""
        ...

    async def sample(self, timestamp: float) -> Sequence[GpuSample]: ...

    async def close(self) -> None: ...


class ThreadedNvmlSource:
    """Runs the blocking NvmlSource in a worker thread so a slow driver call never stalls the loop."""

    def __init__(self, node: str) -> None:
        from kumiki.agent.adapters.nvml import NvmlSource

        self._source = NvmlSource(node)
        self.errors = self._source.errors
        self.unsupported = self._source.unsupported

    async def open(self, now: float) -> GpuInventory:
        return await asyncio.to_thread(self._source.open, now)

    async def reopen(self, now: float) -> GpuInventory:
        """NVML shut down and initialised again: MIG device handles and event subscriptions are per layout, and a
        reconfiguration leaves the old ones stale."""
        return await asyncio.to_thread(self._source.reopen, now)

    async def sample(self, timestamp: float) -> Sequence[GpuSample]:
        return await asyncio.to_thread(self._source.sample, timestamp)

    async def close(self) -> None:
        await asyncio.to_thread(self._source.close)


# --------------------------------------------------------------------------------------------------
# The loops


@dataclass
class RunStats:
    ticks: int = 0
    samples: int = 0
    skipped_ticks: int = 0
    tick_errors: int = 0
    publish_errors: int = 0
    inventory_changes: int = 0  # inventories that differed from the one before, published
    inventory_errors: int = 0  # re-reads or their publications that failed (the old inventory stays)
    source_errors: dict[str, int] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "ticks": self.ticks,
            "samples": self.samples,
            "skipped_ticks": self.skipped_ticks,
            "tick_errors": self.tick_errors,
            "publish_errors": self.publish_errors,
            "inventory_changes": self.inventory_changes,
            "inventory_errors": self.inventory_errors,
            "source_errors": dict(sorted(self.source_errors.items())),
            "unsupported": sorted(self.unsupported),
        }


Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


async def run_sampling(
    source: Source,
    sink: SampleSink,
    schedule: TickSchedule,
    *,
    clock: Clock = time.monotonic,
    wall: Clock = time.time,
    sleep: Sleep = asyncio.sleep,
    stop: asyncio.Event | None = None,
    on_tick: Callable[[float], None] | None = None,
    metrics_node: str | None = None,
    inventory: GpuInventory | None = None,
    inventory_sink: InventorySink | None = None,
    inventory_every_s: float = 0.0,
) -> RunStats:
    """Sample at every due tick and publish; a failing tick or publish is counted, never fatal.

    `metrics_node`: also count into the agent's Prometheus metrics under this node label. `inventory`: what was
    published at start; every `inventory_every_s` (0: never) the source reads it again, and a changed one (a MIG
    reconfiguration, a link gone) goes to `inventory_sink` before the next samples, which come from the new
    layout."""
    stats = RunStats()
    meter = _Meter(metrics_node) if metrics_node is not None else None
    tick = schedule.origin
    inventory_read_at = clock()
    while schedule.is_due(tick) and not (stop is not None and stop.is_set()):
        delay = tick - clock()
        if delay > 0:
            if stop is None:
                await sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
        again = inventory_every_s > 0 and clock() - inventory_read_at >= inventory_every_s
        if again and inventory is not None and inventory_sink is not None:
            inventory_read_at = clock()
            inventory = await _inventory_again(source, inventory_sink, inventory, wall(), stats)
        stats.ticks += 1
        if meter is not None:
            meter.tick(stats, source)
        try:
            samples = await source.sample(wall())
        except Exception:
            stats.tick_errors += 1
            log.exception("sampling tick failed; continuing")
            samples = []
        if samples:
            try:
                await sink.publish(samples)
                stats.samples += len(samples)
                if meter is not None:
                    meter.published(samples)
            except BrokenPipeError:
                # The reader of stdout went away (`| head`): nobody will ever read another sample.
                log.info("output closed by its reader; stopping")
                break
            except Exception:
                stats.publish_errors += 1
                log.exception("publishing %d samples failed; they are dropped", len(samples))
        if on_tick is not None:
            on_tick(tick - schedule.origin)
        tick, skipped = schedule.next_tick(tick, clock())
        if skipped:
            stats.skipped_ticks += skipped
            if meter is not None:
                meter.skipped(skipped)
            log.warning("sampling fell behind: skipped %d tick(s)", skipped)
    stats.source_errors = dict(source.errors)
    if meter is not None:
        meter.tick(stats, source)
    stats.unsupported = sorted(
        {f"gpu{index}:{name}" if index >= 0 else f"system:{name}" for index, name in source.unsupported}
    )
    return stats


async def _inventory_again(
    source: Source, sink: InventorySink, before: GpuInventory, now: float, stats: RunStats
) -> GpuInventory:
    """The inventory read again, published when it changed; on a failure the one before stays (and a change not
    published is found again at the next read)."""
    try:
        after = await source.reopen(now)
    except Exception:
        stats.inventory_errors += 1
        log.exception("reading the inventory again failed; the one from before stays")
        return before
    changes = inventory_changes(before, after)
    if not changes:
        return after
    try:
        await sink.publish_inventory(after)
    except Exception:
        stats.inventory_errors += 1
        log.exception("publishing the changed inventory failed; tried again at the next read")
        return before
    stats.inventory_changes += 1
    log.info("node %s: inventory changed: %s", after.node, "; ".join(changes))
    return after


class _Meter:
    """RunStats into the agent's Prometheus counters, as deltas (the stats stay the run's summary)."""

    def __init__(self, node: str) -> None:
        from kumiki.agent import metrics

        self.metrics = metrics
        self.node = node
        self.seen: dict[str, int] = {}

    def _add(self, stage: str, total: int) -> None:
        delta = total - self.seen.get(stage, 0)
        if delta > 0:
            self.metrics.ERRORS.labels(self.node, stage).inc(delta)
            self.seen[stage] = total

    def tick(self, stats: RunStats, source: Source) -> None:
        self.metrics.TICKS.labels(self.node).inc()
        self._add("tick", stats.tick_errors)
        self._add("publish", stats.publish_errors)
        for kind, count in source.errors.items():
            self._add(f"source:{kind}", count)

    def published(self, samples: Sequence[GpuSample]) -> None:
        self.metrics.SAMPLES.labels(self.node).inc(len(samples))
        self.metrics.LAST_SAMPLE.labels(self.node).set(max(sample.timestamp for sample in samples))

    def skipped(self, ticks: int) -> None:
        self.metrics.SKIPPED_TICKS.labels(self.node).inc(ticks)


def retarget(samples: Sequence[GpuSample], *, node: str | None, shift_s: float) -> list[GpuSample]:
    """Relabel a recording for another node and/or shift its clock (replaying one node as many)."""
    if node is None and shift_s == 0:
        return list(samples)
    return [replace(sample, node=node or sample.node, timestamp=sample.timestamp + shift_s) for sample in samples]


async def run_replay(
    inventory: GpuInventory,
    samples: Sequence[GpuSample],
    sink: SampleSink,
    *,
    speed: float,
    node: str | None,
    keep_timestamps: bool,
    clock: Clock = time.monotonic,
    wall: Clock = time.time,
    sleep: Sleep = asyncio.sleep,
    on_batch: Callable[[int], None] | None = None,
) -> RunStats:
    """Publish a recording batch by batch (one batch per recorded tick), paced by `speed`."""
    stats = RunStats()
    batches = group_by_timestamp(samples)
    if not batches:
        return stats
    first = batches[0][0].timestamp
    shift = 0.0 if keep_timestamps else wall() - first
    if isinstance(sink, InventorySink):
        await sink.publish_inventory(
            replace(inventory, node=node or inventory.node, collected_at=inventory.collected_at + shift)
        )
    started = clock()
    for batch in batches:
        if speed > 0:
            delay = started + (batch[0].timestamp - first) / speed - clock()
            if delay > 0:
                await sleep(delay)
        stats.ticks += 1
        await sink.publish(retarget(batch, node=node, shift_s=shift))
        stats.samples += len(batch)
        if on_batch is not None:
            on_batch(len(batch))
    return stats


# --------------------------------------------------------------------------------------------------
# Wiring


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:.0f}/{task.total:.0f}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )


async def _open_sinks(config: AgentConfig) -> tuple[Any, Any]:
    from kumiki.agent.adapters.jsonl import FanOutSink, JsonLinesSink, RecordingSink

    sinks: list[Any] = []
    recording = None
    if config.record_dir is not None:
        recording = RecordingSink(config.record_dir)
        recording.start()
        sinks.append(recording)
    if config.output == "kafka":  # kumiki.gpu.samples on KUMIKI_KAFKA_BOOTSTRAP (see docs/telemetry.md)
        from kumiki.agent.adapters.kafka import KafkaSink

        sinks.append(await KafkaSink.open(token_file=config.token_file, node_key_file=config.node_key_file))
    elif config.output is not None:
        sinks.append(JsonLinesSink.open(config.output))
    return FanOutSink(sinks), recording


async def run(config: AgentConfig) -> int:
    from kumiki.agent.adapters.jsonl import read_recording

    sink, recording = await _open_sinks(config)
    try:
        if config.replay_dir is not None:
            try:
                inventory, samples = read_recording(config.replay_dir)
            except RecordError as error:
                log.error("cannot replay: %s", error)
                return 1
            with _progress() as progress:
                task = progress.add_task("replay", total=len(samples))
                stats = await run_replay(
                    inventory,
                    samples,
                    sink,
                    speed=config.speed,
                    node=config.node,
                    keep_timestamps=config.keep_timestamps,
                    on_batch=lambda n: progress.advance(task, n),
                )
        else:
            live = await _run_live(config, sink, recording)
            if live is None:
                return 1
            stats = live
        log.info("done: %s", stats.summary())
        return 0
    finally:
        await sink.close()


async def _run_live(config: AgentConfig, sink: Any, recording: Any) -> RunStats | None:
    assert config.node is not None
    source: Source
    if config.source == "dcgm":
        from kumiki.agent.adapters.dcgm import DcgmExporterSource, DcgmScrapeFailed

        source = DcgmExporterSource(config.dcgm_url, config.node)
        start_errors: tuple[type[Exception], ...] = (DcgmScrapeFailed,)
    else:
        from kumiki.agent.adapters.nvml import NvmlUnavailable

        source = ThreadedNvmlSource(config.node)
        start_errors = (NvmlUnavailable,)
    try:
        inventory = await source.open(time.time())
    except start_errors as error:
        log.error("%s", error)
        return None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    try:
        log.info(
            "node %s: %d GPU(s), driver %s, CUDA %s",
            inventory.node,
            len(inventory.gpus),
            inventory.driver_version,
            inventory.cuda_driver_version,
        )
        await sink.publish_inventory(inventory)
        metrics_node = None
        if config.metrics_port is not None:
            from kumiki.agent import metrics

            metrics.serve(config.metrics_port, config.metrics_host)
            metrics.GPUS.labels(inventory.node).set(len(inventory.gpus))
            metrics_node = inventory.node
            log.info("metrics on http://%s:%d/metrics", config.metrics_host, config.metrics_port)
        schedule = TickSchedule(config.interval_s, time.monotonic(), config.duration_s)
        if config.duration_s is not None and config.record_dir is not None:
            with _progress() as progress:
                task = progress.add_task("record", total=config.duration_s)
                stats = await run_sampling(
                    source,
                    sink,
                    schedule,
                    stop=stop,
                    on_tick=lambda elapsed: progress.update(task, completed=elapsed + config.interval_s),
                    metrics_node=metrics_node,
                )  # a recording keeps the layout it started with: no re-reads
        else:
            stats = await run_sampling(
                source,
                sink,
                schedule,
                stop=stop,
                metrics_node=metrics_node,
                inventory=inventory,
                inventory_sink=sink,
                inventory_every_s=config.inventory_interval_s,
            )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)
        await source.close()
    if recording is not None:
        recording.write_summary(
            {
                "source": config.source,
                "interval_s": config.interval_s,
                "duration_s": config.duration_s,
                **stats.summary(),
            }
        )
    return stats


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    logging.basicConfig(
        level=config.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(run(config))
    except KeyboardInterrupt:
        return 130
    except FileExistsError as error:
        parser.exit(2, f"{parser.prog}: error: --record: {error}\n")
    except BrokerUnavailable as error:  # one line naming the variable (address, SASL password, CA), exit 3
        parser.exit(3, f"{parser.prog}: {error}\n")
