"""Bind latency and throughput of the placement service, next to a naive first-fit baseline in the same run.

    python benchmarks/placement_bind.py [--nodes 1000] [--groups 5000] [--concurrency 32] [--warmup-events 100000]
        [--bootstrap HOST:PORT]

Cluster: `--nodes` emulated nodes x 8 GPUs, four node shapes (A100 with two NVLink islands, H100 with one,
shareable V100, A100 in MIG mode), 16 nodes a rack. Requests: `--groups` pod groups whose GPU counts follow
the Philly slice (1 to 16 GPUs; over 8 as whole-node pods), plus 10% fractional and 10% MIG requests.

Two measurements, each against the baseline (whole GPUs and shares taken from the first node that fits,
by scanning every node; no topology, no events):
1. the decision alone, in this process: PlacementBook.bind vs the naive function;
2. through gRPC (after `--warmup-events` through the broker, so a freshly started broker's JVM is warm):
   `python -m kumiki.placement` (publishing every bind to the broker before answering) vs
   the naive placer behind the same gRPC service, each in its own process: unary Bind with 1 call in
   flight (latency), then with `--concurrency` calls in flight, then BindStream (one stream,
   `--concurrency` requests in flight on it). Each server's CPU time per bind is read from /proc: on a
   machine where client, broker and server share the cores, 1 / (CPU per bind) is what one server process
   sustains with a core to itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import csv
import os
import random
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from _support import PHILLY, broker, percentile, process_cpu_s, publish_from_callers
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.devstack.cluster import emulated_nodes, publish_nodes
from kumiki.devstack.processes import free_port, port_open, terminate
from kumiki.placement.adapters.convert import bind_command, node_spec
from kumiki.placement.core import PlacementBook

MIG_SHARE = {"1g.10gb": 1 / 7, "2g.20gb": 2 / 7, "3g.40gb": 3 / 7}


def philly_sizes() -> list[int]:
    with PHILLY.open() as handle:
        return [int(float(row["gpus"])) for row in csv.DictReader(handle)]


def requests(groups: int, seed: int = 0) -> list[placement_pb2.BindRequest]:
    rng = random.Random(seed)
    sizes = philly_sizes()
    out = []
    for index in range(groups):
        kind = rng.random()
        if kind < 0.1:
            pods = [common_pb2.PodResources(gpu_fraction=rng.choice((0.25, 0.5)), gpu_memory_mib=8192)]
        elif kind < 0.2:
            pods = [common_pb2.PodResources(mig_profile=rng.choice(tuple(MIG_SHARE)), gpu_model="A100-80GB")]
        else:
            gpus = rng.choice(sizes)
            pods = [common_pb2.PodResources(gpus=min(gpus, 8)) for _ in range(max(1, gpus // 8))]
        out.append(
            placement_pb2.BindRequest(
                job=common_pb2.JobRef(job_id=f"bench-{index}", generation=1), queue=f"vc-{index % 11}", pods=pods
            )
        )
    return out


class NaiveFirstFit:
    """The baseline: scan every node in order for each pod; whole GPUs by index, shares by remaining capacity."""

    def __init__(self, nodes: int, gpus: int = 8) -> None:
        self.free = [list(range(gpus)) for _ in range(nodes)]
        self.share = [[1.0] * gpus for _ in range(nodes)]

    def bind(self, request: placement_pb2.BindRequest) -> list[tuple[int, list[int]]] | None:
        taken: list[tuple[int, list[int], float]] = []
        for pod in request.pods:
            placed = None
            for node, free in enumerate(self.free):
                if pod.gpus:
                    if len(free) >= pod.gpus:
                        placed = (node, free[: pod.gpus], 0.0)
                        del free[: pod.gpus]
                        break
                else:
                    need = pod.gpu_fraction or MIG_SHARE.get(pod.mig_profile, 1.0)
                    for gpu in free:
                        if self.share[node][gpu] >= need:
                            self.share[node][gpu] -= need
                            placed = (node, [gpu], need)
                            break
                    if placed:
                        break
            if placed is None:
                for node, gpus, share in taken:  # all or nothing
                    if share:
                        self.share[node][gpus[0]] += share
                    else:
                        self.free[node].extend(gpus)
                        self.free[node].sort()
                return None
            taken.append(placed)
        return [(node, gpus) for node, gpus, _ in taken]


class NaiveServicer(placement_pb2_grpc.PlacementServicer):
    def __init__(self, nodes: int) -> None:
        self.placer = NaiveFirstFit(nodes)

    async def BindStream(self, requests, context):  # type: ignore[no-untyped-def]
        async for request in requests:
            yield placement_pb2.BindStreamResponse(job=request.job, response=await self.Bind(request, context))

    async def Bind(self, request, context):  # type: ignore[no-untyped-def]
        placed = self.placer.bind(request)
        if placed is None:
            return placement_pb2.BindResponse(outcome=placement_pb2.BindResponse.OUTCOME_PENDING)
        return placement_pb2.BindResponse(
            outcome=placement_pb2.BindResponse.OUTCOME_BOUND,
            assignments=[
                common_pb2.PodAssignment(pod_index=i, node=f"node-{node:05d}", gpu_indices=gpus)
                for i, (node, gpus) in enumerate(placed)
            ],
        )


async def serve_naive(port: int, nodes: int) -> None:
    server = grpc.aio.server()
    placement_pb2_grpc.add_PlacementServicer_to_server(NaiveServicer(nodes), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def decision_only(nodes: int, reqs: list[placement_pb2.BindRequest]) -> dict[str, list[float]]:
    book = PlacementBook()
    for state in emulated_nodes(nodes):
        book.upsert_node(node_spec(state), healthy=True)
    naive = NaiveFirstFit(nodes)
    times: dict[str, list[float]] = {"kumiki": [], "naive first-fit": []}
    commands = [bind_command(request) for request in reqs]
    for command in commands:
        started = time.perf_counter()
        book.bind(command, 0.0)
        times["kumiki"].append(time.perf_counter() - started)
    for request in reqs:
        started = time.perf_counter()
        naive.bind(request)
        times["naive first-fit"].append(time.perf_counter() - started)
    assert book.audit() == []
    return times


@dataclass
class Run:
    latencies: list[float]
    elapsed_s: float
    bound: int
    server_cpu_s: float


async def through_grpc(port: int, reqs: list[placement_pb2.BindRequest], mode: str, in_flight: int) -> Run:
    """Bind every request through a server: unary calls or one BindStream, `in_flight` at a time."""
    latencies: list[float] = []
    bound = 0
    queue = list(reversed(reqs))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = placement_pb2_grpc.PlacementStub(channel)
        await stub.Bind(
            placement_pb2.BindRequest(
                job=common_pb2.JobRef(job_id="warm-up", generation=1), queue="q", pods=[common_pb2.PodResources(gpus=1)]
            )
        )
        with Progress(transient=True) as progress:
            task = progress.add_task(f"{mode}, {in_flight} in flight", total=len(reqs))

            async def unary_worker() -> None:
                nonlocal bound
                while queue:
                    request = queue.pop()
                    started = time.perf_counter()
                    reply = await stub.Bind(request)
                    latencies.append(time.perf_counter() - started)
                    bound += reply.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
                    progress.advance(task)

            async def one_stream() -> None:
                nonlocal bound
                call = stub.BindStream()
                window = asyncio.Semaphore(in_flight)
                sent_at: collections.deque[float] = collections.deque()

                async def write() -> None:
                    for request in reversed(queue):
                        await window.acquire()
                        sent_at.append(time.perf_counter())
                        await call.write(request)
                    await call.done_writing()

                writer = asyncio.create_task(write())
                async for answer in call:
                    latencies.append(time.perf_counter() - sent_at.popleft())
                    window.release()
                    if answer.status_code:
                        raise SystemExit(f"BindStream refused {answer.job.job_id}: {answer.error}")
                    bound += answer.response.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
                    progress.advance(task)
                await writer

            cpu_before = server_cpu(port)
            started = time.perf_counter()
            if mode == "stream":
                await one_stream()
            else:
                await asyncio.gather(*(unary_worker() for _ in range(in_flight)))
            elapsed = time.perf_counter() - started
    return Run(latencies, elapsed, bound, server_cpu(port) - cpu_before)


async def warm_up_broker(bootstrap: str, events: int = 20_000, callers: int = 32) -> None:
    """Publish through the broker before measuring: a JVM that has just started answers its first produce
    requests slowly (classes load, code is compiled), which belongs to nobody's Bind latency."""
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-warmup-{uuid.uuid4().hex[:6]}.")
    await ensure_topics(kafka, [JOB_LIFECYCLE])
    change = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id="warm", generation=1), state=events_pb2.JOB_STATE_BOUND
    )
    items = [(f"warm-{n % 64}", change) for n in range(events)]
    async with EventProducer(kafka, "//kumiki/bench") as producer:
        await publish_from_callers(producer, JOB_LIFECYCLE, items, callers)


SERVERS: dict[int, int] = {}  # gRPC port -> server pid


def server_cpu(port: int) -> float:
    return process_cpu_s(SERVERS[port])


def wait_ready(http_port: int, process: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"placement exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise SystemExit("placement did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"))
    parser.add_argument("--warmup-events", type=int, default=100_000, help="events through the broker first")
    parser.add_argument("--serve-naive", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warmup_events < 0:
        parser.error(f"--warmup-events: must be >= 0, got {args.warmup_events}")
    for name in ("nodes", "groups", "concurrency"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: must be >= 1")
    if args.serve_naive:
        asyncio.run(serve_naive(args.serve_naive, args.nodes))
        return
    reqs = requests(args.groups)
    console = Console()
    decision = decision_only(args.nodes, reqs)

    modes = (("unary", 1), ("unary", args.concurrency), ("stream", args.concurrency))
    with broker(args.bootstrap) as bootstrap:
        asyncio.run(warm_up_broker(bootstrap, args.warmup_events))
        measured: dict[tuple[str, str, int], Run] = {}
        for label, start in (("kumiki", start_kumiki), ("naive first-fit", start_naive)):
            for mode, in_flight in modes:  # a fresh server each
                with start(bootstrap, args.nodes) as port:
                    measured[label, mode, in_flight] = asyncio.run(through_grpc(port, reqs, mode, in_flight))

    table = Table(title=f"Bind: {args.nodes} nodes x 8 GPUs, {args.groups} pod groups")
    for column in ("path", "p50 ms", "p99 ms", "binds/s", "bound", "vs naive (binds/s)", "CPU ms/bind", "1 core"):
        table.add_column(column)
    naive_rate = len(reqs) / sum(decision["naive first-fit"])
    for name in ("kumiki", "naive first-fit"):
        times = decision[name]
        rate = len(times) / sum(times)
        cpu_ms = sum(times) / len(times) * 1e3
        table.add_row(
            f"decision only, {name}",
            f"{percentile(times, 50) * 1e3:.3f}",
            f"{percentile(times, 99) * 1e3:.3f}",
            f"{rate:,.0f}",
            "",
            f"{rate / naive_rate:.2f}x",
            f"{cpu_ms:.3f}",
            f"{1e3 / cpu_ms:,.0f}/s",
        )
    for mode, in_flight in modes:
        naive_grpc_rate = len(reqs) / measured["naive first-fit", mode, in_flight].elapsed_s
        for name in ("kumiki", "naive first-fit"):
            run = measured[name, mode, in_flight]
            rate = len(reqs) / run.elapsed_s
            cpu_ms = run.server_cpu_s / len(reqs) * 1e3
            table.add_row(
                f"gRPC {'Bind' if mode == 'unary' else 'BindStream'}, {name}, {in_flight} in flight",
                f"{percentile(run.latencies, 50) * 1e3:.2f}",
                f"{percentile(run.latencies, 99) * 1e3:.2f}",
                f"{rate:,.0f}",
                f"{run.bound:,}",
                f"{rate / naive_grpc_rate:.2f}x",
                f"{cpu_ms:.3f}",
                f"{1e3 / cpu_ms:,.0f}/s" if cpu_ms else "",
            )
    console.print(table)
    console.print(
        "kumiki's gRPC path publishes every bind to job.lifecycle and scheduling.decisions (acks=all) "
        "before answering; the naive server publishes nothing. '1 core' = 1 / server CPU per bind: what one "
        f"server process sustains with a core to itself (this machine has {os.cpu_count()} cores for client, "
        "broker and server together)."
    )


@contextmanager
def start_kumiki(bootstrap: str, nodes: int, extra: dict[str, str] | None = None) -> Iterator[int]:
    """Placement as a process on `nodes` emulated nodes, topics of its own; `extra`: environment it runs with
    (OTEL_* comes only from there, so a run with tracing and one without differ in nothing else)."""
    kafka = KafkaSettings(bootstrap=bootstrap, topic_prefix=f"bench-{uuid.uuid4().hex[:6]}.")
    asyncio.run(publish_nodes(kafka, emulated_nodes(nodes)))
    grpc_port, http_port = free_port(), free_port()
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("OTEL_")},
        "KUMIKI_KAFKA_BOOTSTRAP": bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_PLACEMENT_GRPC_PORT": str(grpc_port),
        "KUMIKI_PLACEMENT_HTTP_PORT": str(http_port),
        "KUMIKI_LOG_LEVEL": "ERROR",
        **(extra or {}),
    }
    service = subprocess.Popen([sys.executable, "-m", "kumiki.placement"], env=env, start_new_session=True)
    try:
        wait_ready(http_port, service)
        SERVERS[grpc_port] = service.pid
        yield grpc_port
    finally:
        terminate(service.pid)  # SIGTERM: a tracing batch processor flushes what it holds on the way out


@contextmanager
def start_naive(bootstrap: str, nodes: int) -> Iterator[int]:
    port = free_port()
    naive = subprocess.Popen(
        [sys.executable, __file__, "--serve-naive", str(port), "--nodes", str(nodes)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", port):
            if time.monotonic() > deadline or naive.poll() is not None:
                raise SystemExit("the naive server did not start")
            time.sleep(0.1)
        SERVERS[port] = naive.pid
        yield port
    finally:
        terminate(naive.pid)


if __name__ == "__main__":
    main()
