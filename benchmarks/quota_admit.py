"""Quota.Admit latency over real gRPC against `python -m kumiki.quota` (a separate process) on real Postgres.

    python benchmarks/quota_admit.py --bootstrap HOST:PORT --database-url postgresql://... [--requests 3000]

The service runs with bearer-token authentication and a 61-queue tree (organisation, 10 teams, 5 projects
each) on a --gpus cluster: 8,192 by default, which stays below full, so plain admission is the common case;
4,096 fills up mid-run, after which most guaranteed admissions also choose reclaim victims. Every Admit is a
real admission (locks, usage sums, decision, insert), so holdings grow to thousands of rows as in a busy
cluster. The baseline is the gRPC health Check of the same
server over the same channel: the cost of a round trip that does nothing. Sequential calls give the
latency; --concurrency calls in flight give the throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import asyncpg
import grpc
import yaml
from _support import broker, percentile
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from kumiki.common.contracts.v1 import common_pb2, quota_pb2, quota_pb2_grpc
from kumiki.devstack.processes import free_port
from kumiki.quota.adapters.auth import token_digest

console = Console()
ROOT = Path(__file__).resolve().parents[1]
TOKEN = "benchmark-token-" + uuid.uuid4().hex


def queue_file(gpus: int) -> dict[str, object]:
    """Guarantees cover 3/4 of the cluster: projects 1.5% each, teams 7.5%, limits at twice the guarantee."""
    project = gpus * 3 // 200
    queues: list[dict[str, object]] = [{"name": "org", "guarantee": project * 50, "owners": ["bench"]}]
    for team in range(10):
        queues.append({"name": f"team-{team}", "parent": "org", "guarantee": project * 5, "limit": project * 10})
        for index in range(5):
            queues.append({"name": f"project-{index}", "parent": f"org/team-{team}", "guarantee": project})
    return {"cluster": {"gpus": {"A100": gpus}}, "rates": {"A100": 2.0}, "queues": queues}


async def wait_ready(http_port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(600):
        if process.poll() is not None:
            raise SystemExit(f"the quota service exited ({process.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit(f"the quota service did not become ready; see {log}")


async def measure(args: argparse.Namespace, bootstrap: str, database_url: str, folder: Path) -> None:
    (folder / "queues.yaml").write_text(yaml.safe_dump(queue_file(args.gpus)))
    (folder / "tokens.yaml").write_text(yaml.safe_dump({token_digest(TOKEN): "bench"}))
    grpc_port, http_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")},
        "PYTHONPATH": f"{ROOT / 'services'}",
        "KUMIKI_KAFKA_BOOTSTRAP": bootstrap,
        "KUMIKI_TOPIC_PREFIX": f"bench-{uuid.uuid4().hex[:8]}.",
        "KUMIKI_DATABASE_URL": database_url,
        "KUMIKI_DATABASE_POOL_MAX": "20",
        "KUMIKI_QUOTA_GRPC_PORT": str(grpc_port),
        "KUMIKI_QUOTA_HTTP_PORT": str(http_port),
        "KUMIKI_QUOTA_TOKENS_FILE": str(folder / "tokens.yaml"),
        "KUMIKI_QUOTA_CONFIG_FILE": str(folder / "queues.yaml"),
        "KUMIKI_LOG_LEVEL": "WARNING",
    }
    log = folder / "quota.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "kumiki.quota"], env=env, stdout=out, stderr=out)
    try:
        await wait_ready(http_port, process, log)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            quota = quota_pb2_grpc.QuotaStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            metadata = (("authorization", f"Bearer {TOKEN}"),)
            rng = random.Random(3)
            counter = 0

            def request() -> quota_pb2.AdmitRequest:
                nonlocal counter
                counter += 1
                queue = f"org/team-{rng.randrange(10)}/project-{rng.randrange(5)}"
                return quota_pb2.AdmitRequest(
                    job=common_pb2.JobRef(job_id=f"job-{counter}", generation=1),
                    queue=queue, gpus=1, preemptible=rng.random() < 0.7,
                )  # fmt: skip

            for _ in range(50):  # warm up both paths
                await health.Check(health_pb2.HealthCheckRequest(service="kumiki.v1.Quota"))
                await quota.Admit(request(), metadata=metadata)
            results: dict[str, list[float]] = {"health Check (no-op baseline)": [], "Quota.Admit": []}
            outcomes = {"admitted": 0, "borrowed": 0, "denied": 0}
            for _ in range(args.requests):
                started = time.perf_counter()
                await health.Check(health_pb2.HealthCheckRequest(service="kumiki.v1.Quota"))
                results["health Check (no-op baseline)"].append(time.perf_counter() - started)
                started = time.perf_counter()
                reply = await quota.Admit(request(), metadata=metadata)
                results["Quota.Admit"].append(time.perf_counter() - started)
                outcomes["borrowed" if reply.borrowed else "admitted" if reply.admitted else "denied"] += 1

            async def burst(call: str) -> float:
                async def one() -> None:
                    if call == "admit":
                        await quota.Admit(request(), metadata=metadata)
                    else:
                        await health.Check(health_pb2.HealthCheckRequest(service="kumiki.v1.Quota"))

                started = time.perf_counter()
                for _ in range(args.requests // args.concurrency):
                    await asyncio.gather(*(one() for _ in range(args.concurrency)))
                return (args.requests // args.concurrency) * args.concurrency / (time.perf_counter() - started)

            throughput = {"health Check (no-op baseline)": await burst("health"), "Quota.Admit": await burst("admit")}
        held = await (await asyncpg.connect(database_url)).fetchval("SELECT count(*) FROM quota.holdings")
    finally:
        process.terminate()
        process.wait(timeout=30)
    table = Table(
        title=f"Quota.Admit, real gRPC, {args.gpus:,} GPUs, {args.requests:,} calls, then {args.concurrency} in flight"
    )
    for column in ("call", "p50 ms", "p99 ms", "p99 vs baseline", f"calls/s at {args.concurrency} in flight"):
        table.add_column(column)
    base_p99 = percentile(results["health Check (no-op baseline)"], 99)
    for name, values in results.items():
        p99 = percentile(values, 99)
        table.add_row(
            name, f"{percentile(values, 50) * 1e3:.2f}", f"{p99 * 1e3:.2f}", f"{p99 / base_p99:.1f}x",
            f"{throughput[name]:,.0f}",
        )  # fmt: skip
    console.print(table)
    console.print(f"sequential outcomes: {outcomes}; holdings at the end: {held:,}")


async def main(args: argparse.Namespace) -> None:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(args.database_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    base, _, _ = args.database_url.rpartition("/")
    try:
        with broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as folder:
            await measure(args, bootstrap, f"{base}/{name}", Path(folder))
    finally:
        admin = await asyncpg.connect(args.database_url)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_KAFKA_BOOTSTRAP"))
    parser.add_argument("--database-url", default=os.environ.get("KUMIKI_DATABASE_URL"))
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--gpus", type=int, default=8192, help="cluster size; 4096 fills up mid-run (then admissions reclaim)"
    )
    arguments = parser.parse_args()
    if not arguments.database_url:
        parser.error("--database-url (or KUMIKI_DATABASE_URL): a Postgres where databases may be created")
    asyncio.run(main(arguments))
