"""What tracing costs placement: Bind throughput and server CPU with spans exported to a real Jaeger, against the
same service with tracing off, in the same run.

    python benchmarks/tracing_cost.py [--nodes 500] [--groups 3000] [--concurrency 32] [--rounds 2]
        [--ratio 0.1] [--bootstrap HOST:PORT]

Three configurations of `python -m kumiki.placement`, each a fresh process on its own topics, run in turns
(off, on, sampled; `--rounds` times, so drift on a shared machine hits all three alike):
- off: no OTEL_EXPORTER_OTLP_ENDPOINT (no spans are made; the caller's traceparent would still travel);
- on: every Bind traced (Bind SERVER span, the decision's `schedule` span, the Kafka send), exported over
  OTLP/gRPC to Jaeger v2 (infra/observability/build-jaeger.sh) by the SDK's batch processor;
- sampled: OTEL_TRACES_SAMPLER=parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG=`--ratio`.
Requests are placement_bind.py's (Philly GPU counts, 10% fractional, 10% MIG), unary, `--concurrency` in
flight, no quota service (admission allow-all, as in placement_bind.py). Spans Jaeger accepted are read from
its own metrics (otelcol_receiver_accepted_spans), so "on" is shown to have exported what it claims.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import urllib.request
from pathlib import Path

from _support import broker, percentile
from placement_bind import requests, start_kumiki, through_grpc, warm_up_broker
from rich.console import Console
from rich.table import Table

from kumiki.devstack.observability import BUILD_JAEGER, jaeger_binary, start_jaeger
from kumiki.devstack.processes import terminate


def accepted_spans(metrics_port: int) -> float:
    """Spans Jaeger's OTLP receiver accepted so far (its collector metric)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("otelcol_receiver_accepted_spans") and not line.startswith("#")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--groups", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ratio", type=float, default=0.1, help="the sampled configuration's ratio (0..1)")
    parser.add_argument("--warmup-events", type=int, default=20_000, help="events through the broker first")
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"))
    args = parser.parse_args()
    for name in ("nodes", "groups", "concurrency", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be >= 1")
    if not 0 <= args.ratio <= 1:
        parser.error(f"--ratio: expected 0..1, got {args.ratio}")
    if jaeger_binary() is None:
        raise SystemExit(f"no Jaeger binary: build it with `bash {BUILD_JAEGER}`")
    console = Console()
    reqs = requests(args.groups)
    folder = Path(tempfile.mkdtemp(prefix="kumiki-tracing-cost-"))
    jaeger = start_jaeger(folder, folder / "jaeger.log")
    configs = {
        "off": {},
        "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint},
        f"sampled {args.ratio:g}": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": str(args.ratio),
        },
    }
    results: dict[str, list[tuple[float, float, float, float, float]]] = {name: [] for name in configs}
    try:
        with broker(args.bootstrap) as bootstrap:
            if args.warmup_events:
                asyncio.run(warm_up_broker(bootstrap, args.warmup_events))
            for round_ in range(args.rounds):
                for name, extra in configs.items():
                    before = accepted_spans(jaeger.metrics_port)
                    with start_kumiki(bootstrap, args.nodes, extra) as port:
                        run = asyncio.run(through_grpc(port, reqs, "unary", args.concurrency))
                    spans = accepted_spans(jaeger.metrics_port) - before
                    calls = len(reqs)
                    results[name].append(
                        (
                            calls / run.elapsed_s,
                            percentile(run.latencies, 50) * 1e3,
                            percentile(run.latencies, 99) * 1e3,
                            run.server_cpu_s / calls * 1e6,
                            spans / (calls + 1),  # + the warm-up bind
                        )
                    )
                    console.print(
                        f"round {round_ + 1} {name}: {calls / run.elapsed_s:,.0f} binds/s, "
                        f"{run.server_cpu_s / calls * 1e6:.0f} us CPU a bind, {spans:,.0f} spans to Jaeger"
                    )
    finally:
        terminate(jaeger.pid)
    table = Table(
        title=f"Bind with tracing to Jaeger: {args.groups} binds x {args.rounds} rounds, {args.concurrency} in flight,"
        f" {args.nodes} nodes (medians of the rounds)"
    )
    for column in ("tracing", "binds/s", "vs off", "p50 ms", "p99 ms", "server CPU us/bind", "vs off", "spans/bind"):
        table.add_column(column, justify="right")
    base = {index: statistics.median(row[index] for row in results["off"]) for index in range(5)}
    for name, rows in results.items():
        median = [statistics.median(row[index] for row in rows) for index in range(5)]
        table.add_row(
            name,
            f"{median[0]:,.0f}",
            f"{median[0] / base[0]:.2f}x",
            f"{median[1]:.2f}",
            f"{median[2]:.2f}",
            f"{median[3]:.0f}",
            f"{median[3] / base[3]:.2f}x",
            f"{median[4]:.2f}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
