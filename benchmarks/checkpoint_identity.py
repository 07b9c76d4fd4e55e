"""What proving a job's identity costs a Checkpoints.Report, against no check at all in the same run.

    python benchmarks/checkpoint_identity.py [--reports 300] [--database-url URL]

One control plane of our own (etcd and kube-apiserver, as tests/binder start them: `bash infra/kube/build.sh`
builds them once), one pod bound to a job (its `kumiki.io/job` annotation) with a projected-style token minted
by the TokenRequest API, and the Checkpoints service (the real servicer and Postgres registry) on loopback.
Four ways, each `--reports` sequential Reports after a warm-up, one server each:

- none: the check off (the development stack);
- hmac: the job's HMAC token (`KUMIKI_CHECKPOINTS_JOB_KEY_FILE`);
- kube, cached: the pod's ServiceAccount token, the API server's answer kept a minute (what runs);
- kube, every call: the same token reviewed on every call (TokenReview and a pod GET each time): the cost of a
  token the service has not seen in the last minute.

Prints p50 and p99 latency and the ratio of each p50 to `none`'s. Postgres: `--database-url`, else
KUMIKI_DATABASE_URL, else the local stack's (`kumiki up`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' Checkpoints server

import grpc
from _support import percentile
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kumiki.binder.adapters.kube import client_from
from kumiki.binder.core.names import JOB_ANNOTATION
from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, common_pb2
from kumiki.devstack.kube import KubeBinaries, start_kube, stop_kube
from kumiki.preemption.adapters.identity import JobIdentity, job_token
from kumiki.preemption.adapters.kube_identity import KubeTokenReviewer
from tests.binder.support import pod_token  # minted as the kubelet mints a projected volume's
from tests.preemption.servers import checkpoints_service  # the tests' own server on loopback

AUDIENCE = "kumiki-checkpoints"
KEY = os.urandom(32)
WARMUP = 20
console = Console()


async def _pod_token(client: object, namespace: str) -> tuple[str, str]:
    """A pod bound to a job, and a token bound to it as the kubelet would mint one: (job id, token)."""
    job = f"{namespace}/train"
    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))  # type: ignore[attr-defined]
    await client.create(  # type: ignore[attr-defined]
        ServiceAccount.from_dict({"metadata": {"name": "trainer", "namespace": namespace}})
    )
    pod = await client.create(  # type: ignore[attr-defined]
        Pod.from_dict(
            {
                "metadata": {"name": "train-0", "namespace": namespace, "annotations": {JOB_ANNOTATION: job}},
                "spec": {"serviceAccountName": "trainer", "containers": [{"name": "main", "image": "train:1"}]},
            }
        )
    )
    return job, await pod_token(client, namespace, pod, audience=AUDIENCE, account="trainer")  # type: ignore[arg-type]


async def _latencies(
    database: DatabaseSettings, identity: JobIdentity | None, job: str, token: str | None, reports: int
) -> list[float]:
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    seconds = []
    async with (
        checkpoints_service(database, identity) as (address, _),
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
        for step in range(WARMUP + reports):
            report = checkpoints_pb2.CheckpointReport(
                job=common_pb2.JobRef(job_id=job, generation=1), uri=f"s3://ckpt/{step}", step=step + 1
            )
            report.completed_at.seconds = 1_700_000_000 + step
            started = time.perf_counter()
            await stub.Report(report, timeout=30, metadata=metadata)
            if step >= WARMUP:
                seconds.append(time.perf_counter() - started)
    return seconds


async def run(reports: int, database: DatabaseSettings, folder: Path) -> list[tuple[str, list[float]]]:
    stack = start_kube(folder / "kube", kwok=False)
    try:
        admin = client_from(stack.kubeconfig)
        try:
            job, token = await _pod_token(admin, f"bench-{uuid.uuid4().hex[:6]}")
        finally:
            await admin.close()
        ways: list[tuple[str, JobIdentity | None, str | None]] = [
            ("none", None, None),
            ("hmac", JobIdentity(KEY), job_token(KEY, job)),
            ("kube, cached", JobIdentity(kube=KubeTokenReviewer(client_from(stack.kubeconfig), AUDIENCE)), token),
            (
                "kube, every call",
                JobIdentity(kube=KubeTokenReviewer(client_from(stack.kubeconfig), AUDIENCE, cache_s=0.0)),
                token,
            ),
        ]
        results = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("ways", total=len(ways))
            for name, identity, presented in ways:
                progress.update(task, description=name)
                results.append((name, await _latencies(database, identity, job, presented, reports)))
                progress.advance(task)
        return results
    finally:
        stop_kube(stack)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reports", type=int, default=300, help="Reports per way (after a warm-up of 20)")
    parser.add_argument("--database-url", default=None, help="Postgres (default KUMIKI_DATABASE_URL, else local)")
    args = parser.parse_args()
    if args.reports < 10:
        parser.error("--reports: at least 10")
    missing = KubeBinaries.from_env().missing()
    if missing:
        parser.exit(2, f"the Kubernetes binaries are missing ({', '.join(missing)}): bash infra/kube/build.sh\n")
    env = dict(os.environ)
    if args.database_url:
        env["KUMIKI_DATABASE_URL"] = args.database_url
    elif not env.get("KUMIKI_DATABASE_URL"):
        from kumiki.devstack.stack import local_database_url

        env["KUMIKI_DATABASE_URL"] = local_database_url() or ""
    database = DatabaseSettings.from_env(env)
    with tempfile.TemporaryDirectory() as folder:
        results = asyncio.run(run(args.reports, database, Path(folder)))
    base = percentile(results[0][1], 50)
    table = Table(title=f"Checkpoints.Report latency, {args.reports} sequential calls each")
    for column in ("identity", "p50 (ms)", "p99 (ms)", "p50 / none"):
        table.add_column(column, justify="right" if column != "identity" else "left")
    for name, seconds in results:
        p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
        table.add_row(name, f"{p50 * 1000:.2f}", f"{p99 * 1000:.2f}", f"{p50 / base:.2f}x")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
