"""What an idle consumer costs, with and without pacing empty fetches (`kumiki.common.bus.pacing`). One command:

    python benchmarks/idle_consumers.py [--bootstrap HOST:PORT] [--consumers 5] [--window-s 5] [--records 20]

Without --bootstrap it starts the development broker (noida-db, which answers empty fetches at once) in a
temporary folder. For each pause (0 = unpaced, the baseline, then the default 50 ms), in this one process:
`--consumers` consumers sit on empty partitions for `--window-s` seconds (the fetches they send and the CPU
seconds the process spends), then `--records` records are published one at a time into an idle consumer (how
long each takes to be read). Prints a table with the ratios against the unpaced run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services"))

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.conn import AIOKafkaConnection
from rich.console import Console
from rich.table import Table

from kumiki.common.bus import EventProducer
from kumiki.common.bus.admin import ensure_topics, start_client
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.devstack.broker import start_noida
from kumiki.devstack.processes import free_port, terminate


@dataclass(frozen=True, slots=True)
class IdleCost:
    pause_ms: int
    fetches_per_s: float
    cpu_share: float  # CPU seconds of this process per wall second while the consumers sat idle
    read_after_ms: list[float]


class FetchCounter:
    """Counts fetch requests sent by every aiokafka connection in the process."""

    def __init__(self) -> None:
        self.count = 0
        self._send = AIOKafkaConnection.send

    def __enter__(self) -> FetchCounter:
        send = self._send

        def counting(connection: AIOKafkaConnection, request: Any, expect_response: bool = True) -> Any:
            if type(request).__name__.startswith("FetchRequest"):
                self.count += 1
            return send(connection, request, expect_response)

        AIOKafkaConnection.send = counting
        return self

    def __exit__(self, *exc: object) -> None:
        AIOKafkaConnection.send = self._send


async def assigned_consumer(settings: KafkaSettings) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(**settings.client_options(), group_id=None, enable_auto_commit=False)
    await start_client(consumer, settings)
    topic = JOB_LIFECYCLE.full_name(settings.topic_prefix)
    partitions = [TopicPartition(topic, index) for index in range(settings.default_partitions)]
    consumer.assign(partitions)
    await consumer.seek_to_end(*partitions)
    return consumer


async def idle_cost(settings: KafkaSettings, consumers: int, window_s: float, records: int) -> IdleCost:
    await ensure_topics(settings, [JOB_LIFECYCLE])
    started = [await assigned_consumer(settings) for _ in range(consumers)]
    try:
        await asyncio.sleep(0.5)  # past the first fetches' offset lookups
        with FetchCounter() as counter:
            wall, cpu = time.monotonic(), time.process_time()
            await asyncio.sleep(window_s)  # the consumers' fetchers run on their own, as in an idle service
            wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        read_after_ms = []
        reader = started[0]
        async with EventProducer(settings, "//kumiki/benchmark") as producer:
            for index in range(records):
                await asyncio.sleep(0.2)  # idle again between records
                job = events_pb2.JobLifecycle(
                    job=common_pb2.JobRef(job_id=f"idle-{index}", generation=1),
                    state=events_pb2.JOB_STATE_SUBMITTED,
                    queue="a",
                )
                sent = time.monotonic()
                await producer.publish(JOB_LIFECYCLE, f"idle-{index}", job)
                while not await reader.getmany(timeout_ms=1000):
                    pass
                read_after_ms.append(1000.0 * (time.monotonic() - sent))
        return IdleCost(settings.empty_fetch_pause_ms, counter.count / wall, cpu / wall, read_after_ms)
    finally:
        for consumer in started:
            await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="a running broker (default: start noida-db here)")
    parser.add_argument("--consumers", type=int, default=5, help="idle consumers (5: one per service)")
    parser.add_argument("--window-s", type=float, default=5.0, help="seconds the consumers sit idle")
    parser.add_argument("--records", type=int, default=20, help="records published one at a time into an idle one")
    args = parser.parse_args(argv)
    if args.consumers < 1 or args.window_s <= 0 or args.records < 1:
        parser.error("--consumers and --records must be >= 1 and --window-s > 0")
    console = Console()
    with tempfile.TemporaryDirectory(prefix="kumiki-idle-") as folder:
        broker = None
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker = start_noida(Path(folder) / "data", free_port(), Path(folder) / "noida.log")
            bootstrap = broker.bootstrap
        try:
            results = []
            for pause_ms in (0, KafkaSettings().empty_fetch_pause_ms):
                settings = replace(
                    KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-{uuid.uuid4().hex[:8]}."),
                    empty_fetch_pause_ms=pause_ms,
                )
                console.print(f"pause {pause_ms} ms: {args.consumers} idle consumers for {args.window_s:g} s ...")
                results.append(asyncio.run(idle_cost(settings, args.consumers, args.window_s, args.records)))
        finally:
            if broker is not None:
                terminate(broker.pid)
    base = results[0]
    table = Table(title=f"idle consumers on {bootstrap} ({'noida-db' if args.bootstrap is None else 'given broker'})")
    for column in ("pause", "fetches/s", "CPU (cores)", "read after, median ms", "p95 ms", "vs unpaced"):
        table.add_column(column, justify="right")
    for result in results:
        median = statistics.median(result.read_after_ms)
        p95 = statistics.quantiles(result.read_after_ms, n=20)[-1] if len(result.read_after_ms) > 1 else median
        ratio = (
            f"fetches {result.fetches_per_s / base.fetches_per_s:.3f}x, CPU {result.cpu_share / base.cpu_share:.3f}x"
            if base.fetches_per_s and base.cpu_share
            else "-"
        )
        table.add_row(
            f"{result.pause_ms} ms",
            f"{result.fetches_per_s:,.0f}",
            f"{result.cpu_share:.3f}",
            f"{median:.1f}",
            f"{p95:.1f}",
            ratio,
        )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
