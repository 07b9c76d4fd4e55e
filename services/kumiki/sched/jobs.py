"""What a job asks for (a gang of pods) and what a policy may see of it.

The true run time lives only in the simulator (and, for `*-oracle` policies, in `OracleJobView`).
`JobView` is the whole of what non-oracle policies are given; it has no duration field, so the
type system and a test keep forecasts honest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast


class RequestError(ValueError):
    """A job or pod request that is malformed; the message names the field."""


MIB_PER_GB = 1024.0  # `PodRequest.gpu_memory_gb` is in GB (GiB): MiB / 1024; the wire and the pod annotations are MiB


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Resources of one pod. Exactly one GPU form: whole `gpus`, a shared `gpu_fraction`, or a MIG profile."""

    gpus: int = 0
    gpu_fraction: float = 0.0
    gpu_memory_gb: float = 0.0
    mig_profile: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_model: str = ""
    # node rules (a Kubernetes pod's selector, affinity and tolerations, resolved by the binder): the only
    # nodes it may use (empty: any) and nodes it must not use
    nodes: frozenset[str] = frozenset()
    avoid_nodes: frozenset[str] = frozenset()
    # scoring hints (preferred node and pod affinity, ScheduleAnyway spread, PreferNoSchedule taints, scored by
    # the binder): (node name, score) sorted by name, higher better, a node not named 0. Never a reason to wait.
    node_preference: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise RequestError(f"gpus must be >= 0, got {self.gpus}")
        if not 0.0 <= self.gpu_fraction < 1.0 or math.isnan(self.gpu_fraction):
            raise RequestError(f"gpu_fraction must be in [0, 1), got {self.gpu_fraction}")
        forms = (self.gpus > 0) + (self.gpu_fraction > 0) + bool(self.mig_profile)
        if forms > 1:
            raise RequestError("a pod asks for whole gpus, a gpu_fraction or a mig_profile, not several")
        if self.gpu_memory_gb < 0 or self.cpu_milli < 0 or self.memory_mib < 0:
            raise RequestError("gpu_memory_gb, cpu_milli and memory_mib must be >= 0")

    @property
    def node_rules(self) -> bool:
        return bool(self.nodes or self.avoid_nodes)

    def admits(self, node_name: str) -> bool:
        """Whether the pod's node rules let it run on the node."""
        if self.nodes and node_name not in self.nodes:
            return False
        return node_name not in self.avoid_nodes

    @property
    def gpu_demand(self) -> float:
        """GPU capacity asked for, in GPUs (a MIG slice counts its compute share)."""
        if self.mig_profile:
            return int(self.mig_profile.split("g.", 1)[0]) / 7.0
        return self.gpus + self.gpu_fraction

    def shape(self) -> str:
        if self.mig_profile:
            gpu = f"mig {self.mig_profile}"
        elif self.gpu_fraction:
            gpu = f"{self.gpu_fraction:g} GPU ({self.gpu_memory_gb:g} GB)"
        else:
            gpu = f"{self.gpus} GPU"
        extra = f", {self.cpu_milli}m CPU, {self.memory_mib} MiB" if self.cpu_milli or self.memory_mib else ""
        model = f" of model {self.gpu_model}" if self.gpu_model else ""
        return f"{gpu}{model}{extra}"


TOPOLOGY_LEVELS = ("", "nvlink_island", "node", "rack")


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A gang: all of `pods` or, if `min_members` is lower, at least that many; never a partial hold."""

    job_id: str
    pods: tuple[PodRequest, ...]
    min_members: int = 0
    # a topology the placement must not break: "" (none), "nvlink_island", "node" or "rack"
    required_topology: str = ""
    # each pod on a node of its own (the pods' required anti-affinity to each other on the node's hostname)
    distinct_nodes: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        """Its pods' GPUs, largest first: what the waiting lists and the room a gang needs are keyed by."""
        return tuple(sorted((pod.gpus for pod in self.pods), reverse=True))

    def __post_init__(self) -> None:
        if not self.job_id:
            raise RequestError("job_id must not be empty")
        if self.required_topology not in TOPOLOGY_LEVELS:
            raise RequestError(f"required_topology must be one of {TOPOLOGY_LEVELS}, got {self.required_topology!r}")
        if not self.pods:
            raise RequestError("a gang needs at least one pod")
        if not 0 <= self.min_members <= len(self.pods):
            raise RequestError(f"min_members must be in [0, {len(self.pods)}], got {self.min_members}")
        if self.distinct_nodes and self.required_topology in ("node", "nvlink_island") and self.required > 1:
            raise RequestError(
                f"distinct_nodes: {self.required} pods cannot each have a node of their own and share one"
                f" ({self.required_topology})"
            )

    @property
    def required(self) -> int:
        return self.min_members or len(self.pods)

    @property
    def gpu_demand(self) -> float:
        return sum(pod.gpu_demand for pod in self.pods)


def consolidated_gang(job_id: str, gpus: int, gpus_per_node: int) -> GangRequest:
    """Helios/Philly 'consolidated' shape: up to one node's GPUs in one pod, else whole-node pods."""
    if gpus < 1:
        raise RequestError(f"gpus must be >= 1, got {gpus}")
    if gpus <= gpus_per_node:
        return GangRequest(job_id, (PodRequest(gpus=gpus),))
    nodes = -(-gpus // gpus_per_node)
    return GangRequest(job_id, tuple(PodRequest(gpus=gpus_per_node) for _ in range(nodes)))


@dataclass(frozen=True, slots=True)
class CheckpointModel:
    """Cost of preemption, identical for every preemptive policy.

    A job of a preemptive policy checkpoints every `interval_s` of progress, each checkpoint
    stopping it for `checkpoint_cost_s`; a preempted job loses the progress since its last
    checkpoint and pays `restore_cost_s` when it resumes.
    """

    interval_s: float = 1800.0
    checkpoint_cost_s: float = 60.0
    restore_cost_s: float = 60.0

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise RequestError(f"checkpoint interval must be > 0 s, got {self.interval_s}")
        if self.checkpoint_cost_s < 0 or self.restore_cost_s < 0:
            raise RequestError("checkpoint and restore costs must be >= 0 s")

    def lost_progress(self, progress_s: float) -> float:
        """Progress lost if evicted now: the part since the last checkpoint."""
        return progress_s - self.checkpointed(progress_s)

    def checkpointed(self, progress_s: float) -> float:
        return math.floor(progress_s / self.interval_s) * self.interval_s

    def wall_time(self, start_progress_s: float, end_progress_s: float) -> float:
        """Wall seconds to go from one progress point to another, counting checkpoint stops."""
        checkpoints = math.floor(end_progress_s / self.interval_s) - math.floor(start_progress_s / self.interval_s)
        # no checkpoint is written at the moment the job finishes
        if end_progress_s > 0 and end_progress_s % self.interval_s == 0:
            checkpoints -= 1
        return (end_progress_s - start_progress_s) + max(0, checkpoints) * self.checkpoint_cost_s

    def progress_after(self, start_progress_s: float, wall_s: float) -> float:
        """Inverse of `wall_time`: progress reached after `wall_s` wall seconds of running."""
        interval = self.interval_s
        next_checkpoint = (math.floor(start_progress_s / interval) + 1) * interval
        if wall_s <= next_checkpoint - start_progress_s:
            return start_progress_s + max(0.0, wall_s)
        remaining = wall_s - (next_checkpoint - start_progress_s) - self.checkpoint_cost_s
        if remaining <= 0:
            return next_checkpoint  # stopped while writing that checkpoint
        cycles = math.floor(remaining / (interval + self.checkpoint_cost_s))
        remaining -= cycles * (interval + self.checkpoint_cost_s)
        return next_checkpoint + cycles * interval + min(remaining, interval)


@dataclass(frozen=True, slots=True)
class JobView:
    """What a non-oracle policy knows about a job: submit-time features plus observed history."""

    features: JobFeatures
    gpus: int
    queue: str
    submit_s: float
    priority: int = 0
    preemptible: bool = True
    executed_s: float = 0.0
    attained_gpu_s: float = 0.0
    preemptions: int = 0
    forecast: RuntimeForecast | None = None
    since_checkpoint_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    # times idle reclaim evicted it that still count (live: none once a later attempt was found computing): it
    # waits behind the jobs of its tier idle reclaim has not evicted
    idle_reclaims: int = 0

    @property
    def job_id(self) -> str:
        return self.features.job_id

    @property
    def demoted(self) -> int:
        """1 once idle reclaim has evicted it, else 0: the place within its tier before the policy's key."""
        return 1 if self.idle_reclaims else 0


@dataclass(frozen=True, slots=True)
class OracleJobView(JobView):
    """What an `*-oracle` policy sees: everything plus the true remaining run time."""

    remaining_s: float = 0.0
