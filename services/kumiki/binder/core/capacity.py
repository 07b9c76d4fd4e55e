"""The largest shapes the cluster's nodes offer: why a pod could never fit, without walking every node per pod."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kumiki.binder.core.nodes import BLOCKING_EFFECTS, PREFER_NO_SCHEDULE, Node
from kumiki.sched.jobs import PodRequest


def never_fits(resources: PodRequest, nodes: Iterable[Node]) -> str:
    """Why no node in the cluster, even empty, could ever hold this pod ("" when some node could)."""
    return ClusterCapacity.of(nodes).never_fits(resources)


@dataclass(frozen=True, slots=True)
class ClusterCapacity:
    """The largest shapes among the schedulable nodes, computed once per node change: `never_fits` for each
    pod of a stream of thousands must not walk every node."""

    nodes: int
    gpus: int
    mig: bool
    shareable: bool
    models: frozenset[str]
    cpu_milli: int
    memory_mib: int
    tainted: bool = False  # some node has a NoSchedule / NoExecute taint: every pod's rules must be checked
    prefer_tainted: bool = False  # some node has a PreferNoSchedule taint: every pod's nodes are scored

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> ClusterCapacity:
        candidates = list(nodes)
        return cls(
            nodes=len(candidates),
            gpus=max((node.gpus for node in candidates), default=0),
            mig=any(node.mig for node in candidates),
            shareable=any(node.shareable for node in candidates),
            models=frozenset(node.gpu_model for node in candidates),
            cpu_milli=max((node.cpu_milli for node in candidates), default=0),
            memory_mib=max((node.memory_mib for node in candidates), default=0),
            tainted=any(taint.effect in BLOCKING_EFFECTS for node in candidates for taint in node.taints),
            prefer_tainted=any(taint.effect == PREFER_NO_SCHEDULE for node in candidates for taint in node.taints),
        )

    def never_fits(self, resources: PodRequest) -> str:
        """Why no node in the cluster, even empty, could ever hold this pod ("" when some node could)."""
        if not self.nodes:
            return "no nodes in the cluster"
        if resources.gpus > self.gpus:
            return f"asks for {resources.gpus} GPUs; the largest node has {self.gpus}"
        if resources.mig_profile and not self.mig:
            return f"asks for MIG slice {resources.mig_profile}; no node is in MIG mode"
        if resources.gpu_fraction and not self.shareable:
            return "asks for a GPU fraction; no node shares its GPUs"
        if resources.gpu_model and resources.gpu_model not in self.models:
            return f"asks for GPU model {resources.gpu_model}; no node has it"
        if resources.cpu_milli > self.cpu_milli:
            return f"asks for {resources.cpu_milli}m CPU; the largest node has {self.cpu_milli}m"
        if resources.memory_mib > self.memory_mib:
            return f"asks for {resources.memory_mib} MiB memory; the largest node has {self.memory_mib} MiB"
        return ""


def capacity_changed(before: Node, after: Node) -> bool:
    """Whether a node's change can change the cluster's ClusterCapacity (a heartbeat does not)."""
    return before.taints != after.taints or (
        before.schedulable,
        before.gpus,
        before.mig,
        before.shareable,
        before.gpu_model,
        before.cpu_milli,
        before.memory_mib,
    ) != (after.schedulable, after.gpus, after.mig, after.shareable, after.gpu_model, after.cpu_milli, after.memory_mib)
