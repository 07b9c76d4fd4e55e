"""What placement's metrics read off the book, kept pure (no I/O, no clock) so the simulator and tests can too.

Fragmentation here is the operator's question, "are free GPUs stranded?": free whole GPUs on healthy nodes where
no pod of any job waiting for capacity fits. A node with 3 free GPUs is stranded for a queue of 4-GPU pods and not
for a queue with a 1-GPU pod. Nothing waiting: nothing is stranded (free capacity nobody asks for is idle, not
fragmented). Jobs held back by quota are not waiting for capacity and do not count. Per-pod fit on one node is
the measure (the simulator's FGD score, `kumiki.sched.fragmentation`, weighs an expected request mix instead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from kumiki.placement.core import PendingJob, PlacementBook
from kumiki.sched.cluster import ClusterState, NodeSpec
from kumiki.sched.jobs import PodRequest


def node_shape(spec: NodeSpec) -> str:
    """The label of a node shape: GPUs and model (low cardinality: one per kind of machine in the fleet)."""
    return f"{spec.gpus}x {spec.gpu_model}"


def _fits(pod: PodRequest, spec: NodeSpec, free: int, cpu_free: int, memory_free: int) -> bool:
    """Could this pod use this node's free whole GPUs (model, count, CPU and memory)? MIG pods use MIG slices."""
    if pod.gpu_model and pod.gpu_model != spec.gpu_model:
        return False
    if pod.mig_profile:
        return False
    if pod.gpus > free or (pod.gpus == 0 and (not spec.sharing or pod.gpu_memory_gb > spec.gpu_memory_gb)):
        return False
    if spec.cpu_milli and pod.cpu_milli > cpu_free:
        return False
    return not (spec.memory_mib and pod.memory_mib > memory_free)


def stranded_gpus(state: ClusterState, healthy: Iterable[bool], waiting: Iterable[PodRequest]) -> dict[str, int]:
    """Per node shape: free whole GPUs (healthy nodes) that none of the `waiting` pods could use where they are.
    Every shape of the cluster has an entry (0 included), so a series drops to 0 rather than vanishing."""
    pods = set(waiting)
    stranded = {node_shape(spec): 0 for spec in state.spec.nodes}
    if not pods:
        return stranded
    for index, (spec, up) in enumerate(zip(state.spec.nodes, healthy, strict=False)):
        free = state.free_count(index)
        if not up or free == 0:
            continue
        cpu_free, memory_free = state.cpu_free(index), state.memory_free(index)
        if not any(_fits(pod, spec, free, cpu_free, memory_free) for pod in pods):
            stranded[node_shape(spec)] += free
    return stranded


def waiting_for_capacity(pending: Iterable[PendingJob]) -> list[PodRequest]:
    return [pod for job in pending if not job.held for pod in job.command.request.pods]


def pending_by_reason(pending: Iterable[PendingJob]) -> Counter[str]:
    """Waiting jobs by the resource their pending reason names (quota, gpus, nodes, cpu, ...)."""
    return Counter(job.reason.resource for job in pending)


def book_stranded_gpus(book: PlacementBook) -> dict[str, int]:
    if not book.nodes:
        return {}
    return stranded_gpus(book.state, book.healthy, waiting_for_capacity(book.pending.values()))
