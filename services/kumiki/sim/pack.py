"""The FGD fragmentation benchmark: pods arrive, never leave, until the cluster's GPUs are all requested.

Arrivals repeat the pod file (shuffled) once it runs out; seed 0 starts with the file's order and
every other seed shuffles everything. A pod that fits nowhere is dropped and counted. The result per
strategy is the share of GPU capacity still unallocated at the end, and the arrival count at the first
failed placement. Strategy rules match `kumiki.sched.placement` (a test checks that they agree).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kumiki.sched.fragmentation import EPS, FragmentationIndex, MixArrays
from kumiki.sim.trace import TraceJob, TraceNode

MIX_COVERAGE = 0.8


class PackError(ValueError):
    """Input the benchmark cannot use; the message names the pod or node and field."""


@dataclass(frozen=True, slots=True)
class PackPod:
    gpu: float
    cpu_milli: float
    memory_mib: float
    model: str


@dataclass(frozen=True, slots=True)
class PackProblem:
    pods: tuple[PackPod, ...]
    gpus: np.ndarray
    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    models: tuple[str, ...]
    mix: MixArrays

    @property
    def capacity(self) -> int:
        return int(self.gpus.sum())


def prepare(pods: Sequence[TraceJob], nodes: Sequence[TraceNode]) -> PackProblem:
    if not nodes:
        raise PackError("--nodes: the node file has no nodes")
    packed: list[PackPod] = []
    for pod in pods:
        if pod.cpus is None or pod.mem_gb is None:
            raise PackError(f"--pods: pod {pod.job_id}: fields 'cpus' and 'mem_gb' are required for packing")
        if pod.gpus > 1 and pod.gpus != int(pod.gpus):
            raise PackError(f"--pods: pod {pod.job_id}: field 'gpus' above 1 must be whole, got {pod.gpus:g}")
        packed.append(PackPod(pod.gpus, pod.cpus * 1000.0, pod.mem_gb * 1024.0, pod.model))
    if not packed:
        raise PackError("--pods: the pod file has no pods")
    if max(node.gpus for node in nodes) > 8 or max(pod.gpu for pod in packed) > 8:
        raise PackError("--nodes: this benchmark supports at most 8 GPUs per node and per pod")
    # the expected mix: the popularity of each (GPU, CPU, memory) shape among the file's GPU pods
    counts: dict[tuple[float, float, float], int] = {}
    for shape in packed:
        if shape.gpu > 0:
            key = (round(shape.gpu, 4), shape.cpu_milli, shape.memory_mib)
            counts[key] = counts.get(key, 0) + 1
    if not counts:
        raise PackError("--pods: no pod requests a GPU")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    # the most popular shapes covering MIX_COVERAGE of GPU pods (FGD keeps "typical" pods the same
    # way): the long tail of rare shapes adds scoring time and, on openb, no less fragmentation
    covered = np.cumsum([count for _, count in ranked]) / sum(counts.values())
    ranked = ranked[: int(np.searchsorted(covered, MIX_COVERAGE - EPS)) + 1]
    total = sum(count for _, count in ranked)
    mix = MixArrays(
        gpu=np.array([key[0] for key, _ in ranked], dtype=np.float64),
        cpu=np.array([key[1] for key, _ in ranked], dtype=np.float64),
        memory=np.array([key[2] for key, _ in ranked], dtype=np.float64),
        weight=np.array([count / total for _, count in ranked], dtype=np.float64),
    )
    return PackProblem(
        tuple(packed),
        np.array([node.gpus for node in nodes], dtype=np.int64),
        np.array([node.cpu_milli for node in nodes], dtype=np.float64),
        np.array([node.memory_mib for node in nodes], dtype=np.float64),
        tuple(node.model for node in nodes),
        mix,
    )


def arrival_order(count: int, seed: int) -> Callable[[], int]:
    """Endless pod indices: seed 0 gives the file order first, then shuffled repeats."""
    rng = random.Random(seed)
    state: dict[str, Any] = {"order": list(range(count)), "position": 0}
    if seed:
        rng.shuffle(state["order"])

    def next_index() -> int:
        if state["position"] >= count:
            state["order"] = list(range(count))
            rng.shuffle(state["order"])
            state["position"] = 0
        index: int = state["order"][state["position"]]
        state["position"] += 1
        return index

    return next_index


def choose(
    index: FragmentationIndex, problem: PackProblem, pod: PackPod, strategy: str
) -> tuple[int, list[int]] | None:
    """(node, GPUs) for one pod under a strategy, or None when nothing fits."""
    host = (index.cpu >= pod.cpu_milli - EPS) & (index.memory >= pod.memory_mib - EPS)
    if pod.model:
        host &= np.array([model == pod.model for model in problem.models])
    if pod.gpu >= 1:
        count = int(pod.gpu)
        nodes = np.nonzero(host & (index.full >= count))[0]
        if not len(nodes):
            return None
        if strategy == "first-fit":
            node = int(nodes[0])
        elif strategy == "best-fit":
            node = int(nodes[np.lexsort((nodes, index.sum[nodes]))[0]])
        elif strategy == "spread":
            node = int(nodes[np.lexsort((nodes, -index.sum[nodes]))[0]])
        else:
            delta = np.round(index.delta_whole(nodes, count, pod.cpu_milli, pod.memory_mib), 9)
            node = int(nodes[np.lexsort((nodes, index.sum[nodes], delta))[0]])
        free = np.nonzero(index.valid[node] & (index.free[node] >= 1.0 - EPS))[0]
        return node, [int(gpu) for gpu in free[:count]]
    if pod.gpu > 0:
        nodes, gpus = np.nonzero(host[:, None] & index.valid & (index.free >= pod.gpu - EPS))
        if not len(nodes):
            return None
        card = np.round(index.free[nodes, gpus], 9)  # float sums of shares must tie as they would exactly
        node_sum = np.round(index.sum[nodes], 9)
        if strategy == "first-fit":
            pick = 0  # np.nonzero is row-major: lowest node, then lowest GPU
        elif strategy == "best-fit":
            pick = int(np.lexsort((gpus, nodes, card, node_sum))[0])
        elif strategy == "spread":
            pick = int(np.lexsort((gpus, nodes, -card, -node_sum))[0])
        else:
            delta = np.round(index.delta_share(nodes, gpus, pod.gpu, pod.cpu_milli, pod.memory_mib), 9)
            pick = int(np.lexsort((gpus, nodes, card, node_sum, delta))[0])
        return int(nodes[pick]), [int(gpus[pick])]
    nodes = np.nonzero(host)[0]
    if not len(nodes):
        return None
    if strategy == "first-fit":
        node = int(nodes[0])
    elif strategy == "best-fit":
        node = int(nodes[np.lexsort((nodes, index.cpu[nodes], index.sum[nodes]))[0]])
    elif strategy == "spread":
        node = int(nodes[np.lexsort((nodes, -index.cpu[nodes], -index.sum[nodes]))[0]])
    else:
        delta = np.round(index.delta_host(nodes, pod.cpu_milli, pod.memory_mib), 9)
        node = int(nodes[np.lexsort((nodes, index.cpu[nodes], index.sum[nodes], delta))[0]])
    return node, []


@dataclass(frozen=True, slots=True)
class PackRun:
    strategy: str
    seed: int
    arrivals: int
    failed: int
    first_failure_arrival: int
    requested_gpus: float
    allocated_gpus: float
    unallocated_share: float


def run_pack(problem: PackProblem, strategy: str, seed: int) -> PackRun:
    index = FragmentationIndex(problem.gpus, problem.cpu_milli, problem.memory_mib, problem.mix)
    next_pod = arrival_order(len(problem.pods), seed)
    capacity = problem.capacity
    requested = 0.0
    allocated = 0.0
    arrivals = failed = 0
    first_failure = 0
    while requested < capacity - EPS:
        pod = problem.pods[next_pod()]
        arrivals += 1
        requested += pod.gpu
        chosen = choose(index, problem, pod, strategy)
        if chosen is None:
            failed += 1
            if not first_failure:
                first_failure = arrivals
            continue
        node, gpus = chosen
        share = 1.0 if pod.gpu >= 1 else pod.gpu
        index.take(node, gpus, share, pod.cpu_milli, pod.memory_mib)
        allocated += pod.gpu
    return PackRun(strategy, seed, arrivals, failed, first_failure, requested, allocated, 1.0 - allocated / capacity)


def pack_report(
    problem: PackProblem, strategies: Sequence[str], seeds: int, *, on_run: Callable[[], None] | None = None
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "capacity_gpus": problem.capacity,
        "pods_in_file": len(problem.pods),
        "strategies": {},
    }
    for strategy in strategies:
        runs = []
        for seed in range(seeds):
            runs.append(run_pack(problem, strategy, seed))
            if on_run is not None:
                on_run()
        shares = np.array([run.unallocated_share for run in runs])
        firsts = np.array([run.first_failure_arrival for run in runs], dtype=float)
        report["strategies"][strategy] = {
            "unallocated_share_mean": float(shares.mean()),
            "unallocated_share_std": float(shares.std()),
            "first_failure_arrival_mean": float(firsts.mean()),
            "first_failure_arrival_std": float(firsts.std()),
            "failed_pods_mean": float(np.mean([run.failed for run in runs])),
            "arrivals_mean": float(np.mean([run.arrivals for run in runs])),
            "runs": [
                {
                    "seed": run.seed,
                    "unallocated_share": run.unallocated_share,
                    "first_failure_arrival": run.first_failure_arrival,
                    "arrivals": run.arrivals,
                    "failed": run.failed,
                }
                for run in runs
            ],
        }
    return report
