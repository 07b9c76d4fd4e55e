"""What checking the node agents' proofs costs telemetry's stage 1, against decoding alone in the same run.

    python benchmarks/agent_identity.py [--nodes 100] [--gpus 8] [--batches 50]

One control plane of our own (etcd and kube-apiserver, as tests/binder start them: `bash infra/kube/build.sh`
builds them once), `--nodes` agent pods, one per node, each with a token minted by the TokenRequest API bound to
its pod (as the kubelet mints a projected volume's), and each node's key (`kumiki telemetry node-key`). Stage 1's
records are built as the agent sends them (CloudEvents headers, a GpuSample, its token or its signature),
`--nodes` x `--gpus` to a batch, and handled four ways per batch:

- decode: `FastSamples.reading` on every record (stage 1 without the check: the baseline);
- decode + check, answers kept: the same and `AgentTokens.refusals` with every agent's answer kept (what runs);
- decode + check, first batch: the same on an empty cache, one TokenReview and pod GET per agent (a worker's
  first batch after it starts, or a new agent);
- decode + signature check: records signed with their node's key (agents outside Kubernetes), node keys derived
  once and kept.

Prints the median time per batch of each way, per record, and its ratio to decode's, and the bytes a record
carries without a proof, with the token and with the signature (what the proof adds to gpu.samples).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kumiki.binder.adapters.kube import client_from
from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.bus.topics import GPU_SAMPLES
from kumiki.common.contracts.v1 import events_pb2
from kumiki.common.kube_tokens import PodTokenReviewer
from kumiki.devstack.kube import KubeBinaries, start_kube, stop_kube
from kumiki.telemetry.adapters.agent_identity import CACHE_S, AgentIdentity
from kumiki.telemetry.adapters.consumed import Record
from kumiki.telemetry.adapters.samples import FastSamples
from kumiki.telemetry.core import AGENT_SIGNATURE_HEADER, AGENT_TOKEN_HEADER, node_key, signature
from tests.binder.support import node_object, pod_object, pod_token

AUDIENCE = "kumiki-telemetry"
MASTER = secrets.token_hex(32).encode()  # telemetry's key (KUMIKI_TELEMETRY_AGENT_KEY_FILE)
console = Console()


async def _agents(client: object, namespace: str, nodes: int) -> dict[str, str]:
    """One agent pod per node and its bound token: node -> token."""
    await client.create(Namespace.from_dict({"metadata": {"name": namespace}}))  # type: ignore[attr-defined]
    await client.create(  # type: ignore[attr-defined]
        ServiceAccount.from_dict({"metadata": {"name": "kumiki-agent", "namespace": namespace}})
    )
    tokens = {}
    for index in range(nodes):
        node = f"gpu-{index:04d}"
        await client.create(Node.from_dict(node_object(node)))  # type: ignore[attr-defined]
        manifest = pod_object(namespace, f"agent-{node}")
        manifest["spec"] |= {"serviceAccountName": "kumiki-agent", "nodeName": node}
        pod = await client.create(Pod.from_dict(manifest))  # type: ignore[attr-defined]
        tokens[node] = await pod_token(client, namespace, pod, audience=AUDIENCE, account="kumiki-agent")  # type: ignore[arg-type]
    return tokens


def _batch(tokens: dict[str, str], gpus: int, proof: str = "") -> list[Record]:
    """One tick of every node's GPUs, as the agent's KafkaSink puts them on gpu.samples; `proof`: "", "token" or
    "signature"."""
    now = time.time()
    records = []
    for node, token in tokens.items():
        key = node_key(MASTER, node)
        for gpu in range(gpus):
            # each record its own header values, as the consumer decodes them (no bytes object's hash is shared)
            headers = CloudEventAttributes.new(GPU_SAMPLES.ce_type, f"//kumiki/agent/{node}").headers()
            sample = events_pb2.GpuSample(
                node=node, gpu_uuid=f"GPU-{node}-{gpu}", gpu_index=gpu, gpu_utilization_pct=55.0,
                memory_utilization_pct=40.0, memory_used_mib=40_000, memory_total_mib=81_920, power_w=300.0,
            )  # fmt: skip
            sample.sampled_at.FromNanoseconds(int(now * 1e9))
            value = sample.SerializeToString()
            if proof == "token":
                headers.append((AGENT_TOKEN_HEADER, token.encode()))
            elif proof == "signature":
                headers.append((AGENT_SIGNATURE_HEADER, signature(key, value)))
            records.append(Record(GPU_SAMPLES.name, 0, len(records), f"{node}/{gpu}".encode(), value, headers))
    return records


def _size(record: Record) -> int:
    return len(record.key or b"") + len(record.value or b"") + sum(len(k) + len(v) for k, v in record.headers)


async def _stage_1(records: list[Record], identity: AgentIdentity | None) -> float:
    fast = FastSamples()
    started = time.perf_counter()
    readings = [fast.reading(record.key, record.value, record.headers) for record in records]
    if identity is not None:
        claims = [
            (reading.node, record.headers, record.value or b"")
            for reading, record in zip(readings, records, strict=True)
            if reading
        ]
        reasons = await identity.refusals(claims)
        assert not any(reasons), reasons[:3]
    return time.perf_counter() - started


async def run(nodes: int, gpus: int, batches: int, folder: Path) -> tuple[dict[str, list[float]], tuple[int, int, int]]:
    stack = start_kube(folder / "kube", kwok=False)
    try:
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        admin = client_from(stack.kubeconfig)
        try:
            tokens = await _agents(admin, namespace, nodes)
        finally:
            await admin.close()
        plain, tokened, signed = _batch(tokens, gpus), _batch(tokens, gpus, "token"), _batch(tokens, gpus, "signature")
        accounts = frozenset({f"{namespace}/kumiki-agent"})
        keyed = AgentIdentity(master_key=MASTER)
        seconds: dict[str, list[float]] = {"decode": [], "decode + check, answers kept": [],
                                           "decode + check, first batch": [],
                                           "decode + signature check": []}  # fmt: skip
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("batches", total=batches)
            for _ in range(batches):
                seconds["decode"].append(await _stage_1(plain, None))
                cold = PodTokenReviewer(client_from(stack.kubeconfig), AUDIENCE, cache_s=CACHE_S)
                checker = AgentIdentity(cold, accounts)
                seconds["decode + check, first batch"].append(await _stage_1(tokened, checker))
                seconds["decode + check, answers kept"].append(await _stage_1(tokened, checker))
                await checker.close()
                seconds["decode + signature check"].append(await _stage_1(signed, keyed))
                progress.advance(task)
        return seconds, (_size(plain[0]), _size(tokened[0]), _size(signed[0]))
    finally:
        stop_kube(stack)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100, help="agents, one per node (default 100)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node: records per agent in a batch (default 8)")
    parser.add_argument("--batches", type=int, default=50, help="batches per way (default 50)")
    args = parser.parse_args()
    for option, value, low in (("--nodes", args.nodes, 1), ("--gpus", args.gpus, 1), ("--batches", args.batches, 3)):
        if value < low:
            parser.error(f"{option}: at least {low}, got {value}")
    missing = KubeBinaries.from_env().missing()
    if missing:
        parser.exit(2, f"the Kubernetes binaries are missing ({', '.join(missing)}): bash infra/kube/build.sh\n")
    with tempfile.TemporaryDirectory() as folder:
        seconds, (plain_bytes, token_bytes, signed_bytes) = asyncio.run(
            run(args.nodes, args.gpus, args.batches, Path(folder))
        )
    records = args.nodes * args.gpus
    base = statistics.median(seconds["decode"])
    table = Table(title=f"Stage 1 per batch of {records:,} samples ({args.nodes} agents x {args.gpus} GPUs),"
                        f" median of {args.batches}")  # fmt: skip
    for column in ("way", "ms / batch", "µs / sample", "/ decode"):
        table.add_column(column, justify="left" if column == "way" else "right")
    for way, times in seconds.items():
        median = statistics.median(times)
        table.add_row(way, f"{median * 1000:.2f}", f"{median / records * 1e6:.2f}", f"{median / base:.2f}x")
    console.print(table)
    console.print(f"bytes per sample record (key, value, headers): {plain_bytes} without a proof, {token_bytes}"
                  f" with the token ({token_bytes / plain_bytes:.2f}x), {signed_bytes} with the signature"
                  f" ({signed_bytes / plain_bytes:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
