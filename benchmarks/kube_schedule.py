"""Kumiki's binder against kube-scheduler (default profile) on the same real API server, in the same run.

    python benchmarks/kube_schedule.py --bootstrap 127.0.0.1:19092            # 1,000 nodes x 8 GPUs, 5,000 pods
    python benchmarks/kube_schedule.py --bootstrap ... --nodes 200 --pods 1000  # a smaller run

One control plane (etcd v3.7.0, kube-apiserver v1.37.2, KWOK v0.8.0 from infra/kube/build.sh) with `--nodes`
KWOK nodes of 8 GPUs. The pods are the Philly slice's jobs in arrival order until `--pods` pods: a job of g GPUs
is one pod when g <= --gpus-per-pod, else a gang of ceil(g / --gpus-per-pod) pods with a PodGroup. Phase 1:
placement and the binder as processes (Apache Kafka at --bootstrap), pods with schedulerName kumiki. Phase 2:
the binder and placement stopped, every pod deleted, kube-scheduler started, the same pods with the default
scheduler. Each phase creates its pods as fast as the API server takes them (--creators in flight) and watches
them: scheduling latency = pod created (the create call returned) to spec.nodeName seen; throughput = pods
Running / (last Running - first created), also from the first Binding on, and pods bound / (last bound - first
created) (the scheduler's rate without KWOK's lag in marking pods Running). A gang is partial when some but not
all of its pods are bound at the end of the phase. `--backlog`: every pod is created first, then the scheduler
is started (Kumiki's binder restarted, kube-scheduler started), and latency and rates count from that start.
`--ceiling` adds a phase with no scheduler at all: the same pods created with `spec.nodeName` already set
(first fit by GPUs, in order), so no Binding is made. Its pods/s to Running is what the API server, etcd and
KWOK on this machine allow any scheduler, an upper bound for both of the others.
Creations and the phase's watch go through the binder's aiohttp lane, so the load generator costs both
schedulers the same, and little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Namespace, Node, Pod

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "services"))

from kumiki.binder.adapters.lane import ApiLane, ApiStatusError  # noqa: E402
from kumiki.devstack.kube import KubeStack, start_kube, start_scheduler, stop_component, stop_kube  # noqa: E402
from kumiki.devstack.processes import free_port  # noqa: E402
from kumiki.devstack.stack import readiness  # noqa: E402
from kumiki.replay.kube import node_object  # noqa: E402
from kumiki.sim.trace import load_jobs  # noqa: E402

PodGroup = create_namespaced_resource("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups")
CRD = REPO_ROOT / "charts" / "kumiki" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"


@dataclass
class Workload:
    pods: list[tuple[str, int, str]]  # (name, gpus, group or "")
    groups: dict[str, int]  # group -> size
    gpus: int


def workload(pod_limit: int, gpus_per_pod: int) -> Workload:
    pods: list[tuple[str, int, str]] = []
    groups: dict[str, int] = {}
    total = 0
    for index, job in enumerate(load_jobs("philly-slice")):
        gpus = max(1, int(job.gpus))
        if gpus <= gpus_per_pod:
            if len(pods) + 1 > pod_limit:
                break
            pods.append((f"j{index}", gpus, ""))
        else:
            size = math.ceil(gpus / gpus_per_pod)
            if len(pods) + size > pod_limit:
                break
            group = f"j{index}"
            groups[group] = size
            pods += [(f"{group}-{member}", gpus_per_pod, group) for member in range(size)]
        total += gpus
    return Workload(pods, groups, total)


def pod_manifest(ns: str, name: str, gpus: int, group: str, scheduler: str, node: str = "") -> dict[str, Any]:
    labels = {"scheduling.x-k8s.io/pod-group": group} if group else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "schedulerName": scheduler,
            **({"nodeName": node} if node else {}),
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {
                        "requests": {"cpu": "1", "memory": "4Gi"},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ],
        },
    }


def node_manifest(name: str) -> dict[str, Any]:
    """The replay's KWOK node (kumiki.replay.kube), with NVLink islands of 4 GPUs and 110 pods as kubelet's default."""
    return node_object(name, island=4, pods=110)


def first_fit(load: Workload, nodes: int, gpus_per_node: int = 8) -> dict[str, str]:
    """Pod -> node for the ceiling phase: each pod on the first node with its GPUs free, in arrival order."""
    free = [gpus_per_node] * nodes
    placed: dict[str, str] = {}
    for name, gpus, _ in load.pods:
        for index, left in enumerate(free):
            if left >= gpus:
                free[index] -= gpus
                placed[name] = f"kwok-{index:05d}"
                break
    return placed


async def bounded(coroutines: list[Any], limit: int) -> None:
    slots = asyncio.Semaphore(limit)

    async def one(coroutine: Any) -> None:
        async with slots:
            await coroutine

    await asyncio.gather(*(one(c) for c in coroutines))


@dataclass
class Phase:
    name: str
    created: dict[str, float] = field(default_factory=dict)
    started: float = 0.0  # --backlog: when the scheduler was started (the pods all exist by then)
    bound: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    create_s: float = 0.0

    def report(self, workload: Workload) -> dict[str, Any]:
        if self.started:  # a backlog: each pod waits from the scheduler's start
            latencies = sorted(at - self.started for at in self.bound.values())
        else:
            latencies = sorted(self.bound[name] - self.created[name] for name in self.bound if name in self.created)
        first = self.started or (min(self.created.values()) if self.created else 0.0)
        last = max(self.running.values()) if self.running else first
        first_bound = min(self.bound.values()) if self.bound else last
        last_bind = max(self.bound.values()) if self.bound else first
        partial = 0
        for group, size in workload.groups.items():
            placed = sum(1 for member in range(size) if f"{group}-{member}" in self.bound)
            if 0 < placed < size:
                partial += 1
        return {
            "phase": self.name,
            "pods": len(workload.pods),
            "bound": len(self.bound),
            "running": len(self.running),
            "pods_per_s": len(self.running) / (last - first) if last > first else 0.0,
            # from the first Binding on: the scheduler's own rate, without its start-up or the creations before
            "sched_pods_per_s": len(self.running) / (last - first_bound) if last > first_bound else 0.0,
            # pods bound / (last bound - start): the scheduler's rate without KWOK's (the fake kubelet's) own lag in
            # marking pods Running, which on a loaded machine is the slowest step of all
            "bound_pods_per_s": len(self.bound) / (last_bind - first) if last_bind > first else 0.0,
            "p50_ms": 1000 * statistics.median(latencies) if latencies else None,
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None,
            "gangs": len(workload.groups),
            "partial_gangs": partial,
            "create_s": self.create_s,
        }


async def watch_phase(lane: ApiLane, ns: str, phase: Phase, done: asyncio.Event) -> None:
    """Raw watch events (aiohttp, orjson): the load generator's own CPU is taken from both schedulers alike."""
    async for _, pod in lane.watch(f"/api/v1/namespaces/{ns}/pods"):
        name = pod["metadata"]["name"]
        now = time.perf_counter()
        if (pod.get("spec") or {}).get("nodeName") and name not in phase.bound:
            phase.bound[name] = now
        if (pod.get("status") or {}).get("phase") == "Running" and name not in phase.running:
            phase.running[name] = now
        if done.is_set():
            return


async def run_phase(
    client: AsyncClient,
    lane: ApiLane,
    name: str,
    scheduler: str,
    load: Workload,
    creators: int,
    settle_s: float,
    timeout_s: float,
    start: Callable[[], Awaitable[None]] | None = None,
    nodes: dict[str, str] | None = None,
) -> Phase:
    """`start`: the pods are a backlog, all created before the scheduler is started (else it runs already).
    `nodes`: pods created already bound to these nodes (the ceiling phase; a pod not in it is not created)."""
    ns = f"bench-{name}-{uuid.uuid4().hex[:4]}"
    await client.create(Namespace.from_dict({"metadata": {"name": ns}}))
    phase = Phase(name)
    done = asyncio.Event()
    watcher = asyncio.create_task(watch_phase(lane, ns, phase, done))
    await asyncio.sleep(0.5)
    for group, size in load.groups.items():
        await client.create(
            PodGroup.from_dict({"metadata": {"name": group, "namespace": ns}, "spec": {"minMember": size}})
        )

    async def create(pod_name: str, gpus: int, group: str) -> None:
        body = pod_manifest(ns, pod_name, gpus, group, scheduler, (nodes or {}).get(pod_name, ""))
        for attempt in range(20):
            try:
                await lane.request("POST", f"/api/v1/namespaces/{ns}/pods", body)
                break
            except ApiStatusError as error:
                if error.code != 429:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        phase.created[pod_name] = time.perf_counter()

    started = time.perf_counter()
    pods = [pod for pod in load.pods if nodes is None or pod[0] in nodes]
    await bounded([create(*pod) for pod in pods], creators)
    phase.create_s = time.perf_counter() - started
    if start is not None:
        phase.started = time.perf_counter()
        await start()
    deadline = time.perf_counter() + timeout_s
    last_change, last_count = time.perf_counter(), -1
    while time.perf_counter() < deadline:
        if len(phase.running) == len(pods):
            break
        count = len(phase.running) + len(phase.bound)  # progress: a Binding, or KWOK marking a pod Running
        if count != last_count:
            last_change, last_count = time.perf_counter(), count
        elif time.perf_counter() - last_change > settle_s:
            break  # nothing more starts: what did not fit waits
        await asyncio.sleep(0.2)
    done.set()
    watcher.cancel()
    return phase


async def delete_pods(client: AsyncClient) -> None:
    names = []
    async for pod in client.list(Pod, namespace="*"):
        assert pod.metadata is not None
        names.append((pod.metadata.name, pod.metadata.namespace))
    await bounded([client.delete(Pod, n, namespace=ns, grace_period=0) for n, ns in names], 64)


def binder_metrics(http_port: int, placement_http: int = 0) -> dict[str, float]:
    """Where the binder's time went: mean submission-to-last-Binding per gang, pods bound, Events dropped, and
    Placement's own mean time per decision (its events acknowledged)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "kumiki_binder_gang_bind_seconds_sum",
            "kumiki_binder_gang_bind_seconds_count",
            "kumiki_binder_pods_bound_total",
            "kumiki_binder_events_dropped_total",
        ):
            values[name] = float(value)
    count = values.get("kumiki_binder_gang_bind_seconds_count", 0.0)
    if count:
        values["mean_gang_bind_ms"] = 1000 * values["kumiki_binder_gang_bind_seconds_sum"] / count
    if placement_http:
        with urllib.request.urlopen(f"http://127.0.0.1:{placement_http}/metrics", timeout=5) as response:
            text = response.read().decode()
        sums = {}
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in ("kumiki_placement_bind_seconds_sum", "kumiki_placement_bind_seconds_count"):
                sums[name] = float(value)
        if sums.get("kumiki_placement_bind_seconds_count"):
            mean = sums["kumiki_placement_bind_seconds_sum"] / sums["kumiki_placement_bind_seconds_count"]
            values["placement_mean_decision_ms"] = 1000 * mean
    return values


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


async def wait_ready(port: int, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while readiness(port)[0] != "ready":
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not ready within {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default=os.environ.get("KUMIKI_TEST_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--gpus-per-pod", type=int, default=2, help="jobs with more GPUs become gangs of such pods")
    parser.add_argument("--creators", type=int, default=64, help="pod creations in flight")
    parser.add_argument("--settle", type=float, default=20.0, help="seconds without a new Running pod ends a phase")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--skip-kube-scheduler", action="store_true")
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="a last phase without a scheduler: the pods created bound, what the control plane allows at most",
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="create every pod first, then start the scheduler: its own rate, apart from the creations",
    )
    parser.add_argument(
        "--kube-scheduler-args", default="", help="extra kube-scheduler flags, e.g. '--kube-api-qps=5000'"
    )
    parser.add_argument("--folder", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = parser.parse_args()
    if args.nodes < 1 or args.pods < 1 or args.gpus_per_pod < 1 or args.creators < 1:
        parser.error("--nodes, --pods, --gpus-per-pod and --creators must be >= 1")
    folder = args.folder or Path(tempfile.mkdtemp(prefix="kumiki-kube-bench-"))
    load = workload(args.pods, args.gpus_per_pod)
    print(f"workload: {len(load.pods)} pods, {len(load.groups)} gangs, {load.gpus} GPUs on {args.nodes * 8} GPUs")
    stack: KubeStack = start_kube(folder / "kube")
    processes: list[subprocess.Popen[bytes]] = []
    results = []
    try:
        config = KubeConfig.from_file(str(stack.kubeconfig))
        client = AsyncClient(config=config, field_manager="kumiki-bench")
        lane = ApiLane.from_config(config, connections=args.creators)
        assert lane is not None
        from lightkube.codecs import load_all_yaml

        for obj in load_all_yaml(CRD.read_text()):
            await client.apply(obj, field_manager="kumiki-bench", force=True)
        started = time.perf_counter()
        await bounded([client.create(Node.from_dict(node_manifest(f"kwok-{i:05d}"))) for i in range(args.nodes)], 64)

        async def nodes_ready() -> int:
            count = 0
            async for node in client.list(Node):
                conditions = (node.status.conditions if node.status else None) or []
                count += any(c.type == "Ready" and c.status == "True" for c in conditions)
            return count

        while await nodes_ready() < args.nodes:
            await asyncio.sleep(1.0)
        print(f"{args.nodes} KWOK nodes Ready in {time.perf_counter() - started:.1f}s")

        prefix = f"bench-{uuid.uuid4().hex[:8]}."
        env = {
            **os.environ,
            "KUMIKI_KAFKA_BOOTSTRAP": args.bootstrap,
            "KUMIKI_TOPIC_PREFIX": prefix,
            "PYTHONPATH": str(REPO_ROOT / "services"),
        }
        grpc_port, http_port = free_port(), free_port()
        placement = spawn(
            [sys.executable, "-m", "kumiki.placement"],
            {**env, "KUMIKI_PLACEMENT_GRPC_PORT": str(grpc_port), "KUMIKI_PLACEMENT_HTTP_PORT": str(http_port)},
            folder / "placement.log",
        )
        processes.append(placement)
        await wait_ready(http_port, "placement")
        binder_http = free_port()

        async def start_binder() -> subprocess.Popen[bytes]:
            binder = spawn(
                [sys.executable, "-m", "kumiki.binder"],
                {
                    **env,
                    "KUMIKI_KUBECONFIG": str(stack.kubeconfig),
                    "KUMIKI_PLACEMENT_ADDRESS": f"127.0.0.1:{grpc_port}",
                    "KUMIKI_BINDER_GRPC_PORT": str(free_port()),
                    "KUMIKI_BINDER_HTTP_PORT": str(binder_http),
                    "KUMIKI_BINDER_LEASE_SECONDS": "5",
                },
                folder / "binder.log",
            )
            processes.append(binder)
            await wait_ready(binder_http, "binder")
            return binder

        binder = await start_binder()
        await asyncio.sleep(3.0)  # the binder publishes the nodes; placement reads them
        start: Callable[[], Awaitable[None]] | None = None
        if args.backlog:  # the binder is started again once every pod exists (it resumes from the API's state)
            binder.terminate()
            binder.wait(timeout=30)

            async def restart_binder() -> None:
                nonlocal binder
                await asyncio.sleep(5.0)  # its Lease (5 s) expires, else the new binder waits as a standby
                binder = await start_binder()

            start = restart_binder
        kumiki = await run_phase(
            client, lane, "kumiki", "kumiki", load, args.creators, args.settle, args.timeout, start
        )
        results.append(kumiki.report(load))
        results[-1]["binder_metrics"] = binder_metrics(binder_http, http_port)
        print(json.dumps(results[-1]))
        for process in (binder, placement):
            process.terminate()
            process.wait(timeout=30)
        await delete_pods(client)
        await asyncio.sleep(15.0)  # KWOK works off the deletions before the next phase's pods arrive
        if not args.skip_kube_scheduler:
            scheduler_args = tuple(args.kube_scheduler_args.split())

            async def start_baseline() -> None:
                start_scheduler(stack, scheduler_args)

            if not args.backlog:
                await start_baseline()
            baseline = await run_phase(
                client,
                lane,
                "kube",
                "default-scheduler",
                load,
                args.creators,
                args.settle,
                args.timeout,
                start_baseline if args.backlog else None,
            )
            results.append(baseline.report(load))
            print(json.dumps(results[-1]))
            stop_component(stack, "scheduler")
        if args.ceiling:
            await delete_pods(client)
            await asyncio.sleep(15.0)
            ceiling = await run_phase(
                client, lane, "ceiling", "none", load, args.creators, args.settle, args.timeout,
                nodes=first_fit(load, args.nodes),
            )  # fmt: skip
            results.append(ceiling.report(load))
            print(json.dumps(results[-1]))
        await client.close()
        await lane.close()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        stop_kube(stack)
    print()
    print(
        "| scheduler | pods | running | pods/s | from first bind | bound/s | p50 ms | p99 ms | gangs | partial gangs "
        "| vs kube-scheduler | of the ceiling |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    base = next((row["pods_per_s"] for row in results if row["phase"] == "kube"), 0.0)
    top = next((row["pods_per_s"] for row in results if row["phase"] == "ceiling"), 0.0)
    for row in results:
        ratio = f"{row['pods_per_s'] / base:.2f}x" if base else ""
        share = f"{row['pods_per_s'] / top:.0%}" if top else ""
        p50 = f"{row['p50_ms']:.0f}" if row["p50_ms"] is not None else "-"
        p99 = f"{row['p99_ms']:.0f}" if row["p99_ms"] is not None else "-"
        print(
            f"| {row['phase']} | {row['pods']} | {row['running']} | {row['pods_per_s']:.0f} "
            f"| {row['sched_pods_per_s']:.0f} | {row['bound_pods_per_s']:.0f} | {p50} | {p99} | {row['gangs']} "
            f"| {row['partial_gangs']} | {ratio} | {share} |"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
