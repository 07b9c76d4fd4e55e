"""The cluster model and its allocation state: the single place GPUs, MIG slices and shares are handed out.

`ClusterSpec` is the static shape (nodes, GPU models, NVLink islands, racks, MIG and sharing
modes). `ClusterState` is the mutable allocation book. `allocate` re-checks every GPU, slice and cap
before writing, so no code path can hand a GPU or MIG slice to two jobs or exceed a shared card's
caps. Two indexes keep placement from scanning every node: nodes by free whole-GPU count, and, inside
each count, nodes grouped into classes of identical shape and occupancy. Nodes of one class are
interchangeable for every placement rule except the tie-break on the node index, so a placer looks at
the first node of each class instead of all of them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from kumiki.sched.mig import MIG_PROFILES, MIG_SLOTS, MigError, profile_for

# Capacity slack for float sums of shares (0.1 + 0.2 + 0.7 must fit a card of 1.0).
EPSILON = 1e-9


class AllocationError(RuntimeError):
    """An allocation that would break an invariant (double allocation, over a cap, unknown job)."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: `nvlink_islands` partition its GPUs, `mig_gpus` are in MIG mode, `sharing` allows fractions."""

    name: str
    gpus: int
    gpu_model: str = "V100-32GB"
    gpu_memory_gb: float = 32.0
    cpu_milli: int = 0
    memory_mib: int = 0
    rack: str = "rack-0"
    nvlink_islands: tuple[tuple[int, ...], ...] = ()
    mig_gpus: frozenset[int] = frozenset()
    sharing: bool = True

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"node {self.name}: gpus must be >= 0")
        if self.nvlink_islands:
            members = sorted(gpu for island in self.nvlink_islands for gpu in island)
            if members != list(range(self.gpus)):
                raise ValueError(f"node {self.name}: nvlink_islands must partition GPUs 0..{self.gpus - 1}")
        for gpu in self.mig_gpus:
            if not 0 <= gpu < self.gpus:
                raise ValueError(f"node {self.name}: MIG GPU index {gpu} out of range")
        if self.mig_gpus and self.gpu_model not in MIG_PROFILES:
            raise ValueError(f"node {self.name}: GPU model {self.gpu_model} is not MIG-capable")

    def islands(self) -> tuple[tuple[int, ...], ...]:
        return self.nvlink_islands or (tuple(range(self.gpus)),)

    def shape(self) -> str:
        return f"{self.gpus}x {self.gpu_model}, {self.cpu_milli}m CPU, {self.memory_mib} MiB"

    def capacity_key(self) -> tuple[Hashable, ...]:
        """Everything placement reads of a node except its name and rack (domains filter on those)."""
        return (
            self.gpus,
            self.gpu_model,
            self.gpu_memory_gb,
            self.cpu_milli,
            self.memory_mib,
            self.nvlink_islands,
            self.mig_gpus,
            self.sharing,
        )


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]

    def __post_init__(self) -> None:
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)


def uniform_cluster(
    nodes: int,
    gpus_per_node: int,
    *,
    nodes_per_rack: int = 16,
    island_size: int = 0,
    gpu_model: str = "V100-32GB",
    gpu_memory_gb: float = 32.0,
) -> ClusterSpec:
    """A homogeneous cluster with `nodes_per_rack` nodes per rack and NVLink islands of `island_size` GPUs."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError("nodes and gpus_per_node must be >= 1")
    islands: tuple[tuple[int, ...], ...] = ()
    if island_size and island_size < gpus_per_node:
        islands = tuple(
            tuple(range(start, min(start + island_size, gpus_per_node)))
            for start in range(0, gpus_per_node, island_size)
        )
    return ClusterSpec(
        tuple(
            NodeSpec(
                name=f"node-{index:05d}",
                gpus=gpus_per_node,
                gpu_model=gpu_model,
                gpu_memory_gb=gpu_memory_gb,
                rack=f"rack-{index // nodes_per_rack:04d}",
                nvlink_islands=islands,
            )
            for index in range(nodes)
        )
    )


@dataclass(frozen=True, slots=True)
class GpuShare:
    gpu: int
    fraction: float
    memory_gb: float


@dataclass(frozen=True, slots=True)
class MigSlice:
    gpu: int
    profile: str
    start: int


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod goes: whole GPUs, or one share, or one MIG slice, plus CPU and memory."""

    pod: int
    node: int
    gpus: tuple[int, ...] = ()
    share: GpuShare | None = None
    mig: MigSlice | None = None
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    pods: tuple[PodPlacement, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({pod.node for pod in self.pods}))

    @property
    def whole_gpus(self) -> int:
        return sum(len(pod.gpus) for pod in self.pods)


class OccupancyClass:
    """A node's shape and occupancy, hashed once: placement looks classes up on every call."""

    __slots__ = ("_hash", "content")

    def __init__(self, content: tuple[Hashable, ...]) -> None:
        self.content = content
        self._hash = hash(content)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (
            isinstance(other, OccupancyClass) and self._hash == other._hash and self.content == other.content
        )


@dataclass(slots=True)
class _NodeState:
    free_gpus: set[int]
    cpu_free: int
    memory_free: int
    owner: list[str | None]
    share_used: list[float]
    share_memory_used: list[float]
    share_holders: list[dict[str, GpuShare]]
    mig_mask: list[int]
    mig_holders: list[dict[str, MigSlice]]


@dataclass(slots=True)
class ClusterState:
    """Allocations on a cluster. Mutated only through `allocate` and `release`."""

    spec: ClusterSpec
    nodes: list[_NodeState] = field(default_factory=list)
    allocations: dict[str, Placement] = field(default_factory=dict)
    by_free: list[set[int]] = field(default_factory=list)
    rack_of: list[str] = field(default_factory=list)
    racks: dict[str, list[int]] = field(default_factory=dict)
    free_whole: int = 0
    max_gpus: int = 0
    allocated_capacity: float = 0.0
    # classes[free count][occupancy signature] = ascending node indices (see the module docstring)
    classes: list[dict[OccupancyClass, list[int]]] = field(default_factory=list)
    class_of: list[tuple[int, OccupancyClass] | None] = field(default_factory=list)
    capacity_keys: list[tuple[Hashable, ...]] = field(default_factory=list)
    node_index: dict[str, int] = field(default_factory=dict)  # node name -> index
    # nodes that receive no new work (unhealthy, gone); their allocations stay until released
    cordoned: frozenset[int] = frozenset()
    # nodes whose cards whole-GPU pods take last: they allow sharing and some node does not, so fractional pods
    # (which only sharing nodes take) keep their room while dedicated cards are free
    kept_for_shares: list[bool] = field(default_factory=list)
    # placement's remembered answers, keyed by what they depend on (occupancy classes, pure inputs): never stale
    memo: dict[Hashable, dict[Hashable, object]] = field(default_factory=dict)

    @classmethod
    def empty(cls, spec: ClusterSpec) -> ClusterState:
        state = cls(spec)
        state.max_gpus = max((node.gpus for node in spec.nodes), default=0)
        state.by_free = [set() for _ in range(state.max_gpus + 1)]
        state.classes = [{} for _ in range(state.max_gpus + 1)]
        for index, node in enumerate(spec.nodes):
            whole = {gpu for gpu in range(node.gpus) if gpu not in node.mig_gpus}
            state.nodes.append(
                _NodeState(
                    free_gpus=whole,
                    cpu_free=node.cpu_milli,
                    memory_free=node.memory_mib,
                    owner=[None] * node.gpus,
                    share_used=[0.0] * node.gpus,
                    share_memory_used=[0.0] * node.gpus,
                    share_holders=[{} for _ in range(node.gpus)],
                    mig_mask=[0] * node.gpus,
                    mig_holders=[{} for _ in range(node.gpus)],
                )
            )
            state.by_free[len(whole)].add(index)
            state.free_whole += len(whole)
            state.rack_of.append(node.rack)
            state.racks.setdefault(node.rack, []).append(index)
            state.capacity_keys.append(node.capacity_key())
            state.node_index[node.name] = index
            state.class_of.append(None)
            state._classify(index, len(whole))
        mixed = not all(node.sharing for node in spec.nodes)
        state.kept_for_shares = [mixed and node.sharing for node in spec.nodes]
        return state

    # ---- queries -------------------------------------------------------------------------------
    def free_count(self, node: int) -> int:
        return len(self.nodes[node].free_gpus)

    def cpu_free(self, node: int) -> int:
        return self.nodes[node].cpu_free

    def memory_free(self, node: int) -> int:
        return self.nodes[node].memory_free

    def gpu_free_capacity(self, node: int, gpu: int) -> float:
        """Unallocated compute share of one card (1.0 when free, 0.0 when whole-allocated or MIG)."""
        state = self.nodes[node]
        if gpu in self.spec.nodes[node].mig_gpus or state.owner[gpu] is not None:
            return 0.0
        return max(0.0, 1.0 - state.share_used[gpu])

    def allocated_gpus(self) -> float:
        """GPU capacity in use, counting shares and MIG compute slices fractionally (kept as allocations change:
        a live service reads it for a gauge, and a scan of every GPU would stall its event loop)."""
        return max(0.0, self.allocated_capacity)

    def count_allocated_gpus(self) -> float:
        """allocated_gpus the slow way, from every GPU: what audit checks the running total against."""
        total = 0.0
        for index, node in enumerate(self.spec.nodes):
            state = self.nodes[index]
            for gpu in range(node.gpus):
                if gpu in node.mig_gpus:
                    total += sum(int(s.profile.split("g.")[0]) for s in state.mig_holders[gpu].values()) / 7.0
                elif state.owner[gpu] is not None:
                    total += 1.0
                else:
                    total += state.share_used[gpu]
        return total

    def jobs_on(self, node: int) -> set[str]:
        state = self.nodes[node]
        jobs = {owner for owner in state.owner if owner is not None}
        for holders in state.share_holders:
            jobs.update(holders)
        for slices in state.mig_holders:
            jobs.update(slices)
        return jobs

    def class_representatives(self, level: int, skip: Callable[[int], bool]) -> Iterator[int]:
        """The lowest-indexed node of each class with `level` free GPUs that `skip` does not reject."""
        for members in self.classes[level].values():
            for node in members:
                if not skip(node):
                    yield node
                    break

    def occupancy_signature(self, node: int) -> OccupancyClass:
        """Equal for two nodes exactly when every placement rule sees them alike (but for their index)."""
        state = self.nodes[node]
        return OccupancyClass(
            (
                self.capacity_keys[node],
                sum(1 << gpu for gpu in state.free_gpus),
                tuple(owner is not None for owner in state.owner),
                tuple(round(used, 9) for used in state.share_used),
                tuple(round(used, 9) for used in state.share_memory_used),
                tuple(state.mig_mask),
                state.cpu_free,
                state.memory_free,
            )
        )

    # ---- mutation ------------------------------------------------------------------------------
    def _classify(self, node: int, level: int) -> None:
        signature = self.occupancy_signature(node)
        members = self.classes[level].setdefault(signature, [])
        bisect.insort(members, node)
        self.class_of[node] = (level, signature)

    def _declassify(self, node: int) -> None:
        found = self.class_of[node]
        assert found is not None, "every node is classified from the start"
        level, signature = found
        members = self.classes[level][signature]
        del members[bisect.bisect_left(members, node)]
        if not members:
            del self.classes[level][signature]

    def _set_free(self, node: int, before: int, after: int) -> None:
        if before != after:
            self.by_free[before].discard(node)
            self.by_free[after].add(node)
            self.free_whole += after - before
        self._declassify(node)
        self._classify(node, after)

    def allocate(self, placement: Placement) -> None:
        """Apply a placement after re-checking it completely; on any conflict nothing changes."""
        if placement.job_id in self.allocations:
            raise AllocationError(f"job {placement.job_id} already holds an allocation")
        self.check(placement)
        job = placement.job_id
        for pod in placement.pods:
            state = self.nodes[pod.node]
            before = len(state.free_gpus)
            for gpu in pod.gpus:
                state.owner[gpu] = job
                state.free_gpus.discard(gpu)
            if pod.share is not None:
                gpu = pod.share.gpu
                state.share_used[gpu] += pod.share.fraction
                state.share_memory_used[gpu] += pod.share.memory_gb
                state.share_holders[gpu][f"{job}/{pod.pod}"] = pod.share
                state.free_gpus.discard(gpu)
            if pod.mig is not None:
                profile = profile_for(self.spec.nodes[pod.node].gpu_model, pod.mig.profile)
                state.mig_mask[pod.mig.gpu] |= profile.mask(pod.mig.start)
                state.mig_holders[pod.mig.gpu][f"{job}/{pod.pod}"] = pod.mig
            state.cpu_free -= pod.cpu_milli
            state.memory_free -= pod.memory_mib
            self._set_free(pod.node, before, len(state.free_gpus))
            self.allocated_capacity += _capacity_of(pod)
        self.allocations[job] = placement

    def check(self, placement: Placement) -> None:
        """Raise AllocationError if `placement` does not fit the current state (including its own pods)."""
        taken: set[tuple[int, int]] = set()
        shares: dict[tuple[int, int], tuple[float, float]] = {}
        masks: dict[tuple[int, int], int] = {}
        cpu: dict[int, int] = {}
        memory: dict[int, int] = {}
        for pod in placement.pods:
            if not 0 <= pod.node < len(self.nodes):
                raise AllocationError(f"pod {pod.pod}: node index {pod.node} does not exist")
            spec = self.spec.nodes[pod.node]
            state = self.nodes[pod.node]
            for gpu in pod.gpus:
                key = (pod.node, gpu)
                if not 0 <= gpu < spec.gpus or gpu in spec.mig_gpus:
                    raise AllocationError(f"{spec.name} GPU {gpu} cannot be allocated whole")
                if state.owner[gpu] is not None or state.share_holders[gpu] or key in taken or key in shares:
                    raise AllocationError(f"{spec.name} GPU {gpu} is already allocated")
                taken.add(key)
            if pod.share is not None:
                gpu = pod.share.gpu
                key = (pod.node, gpu)
                if not 0 <= gpu < spec.gpus or gpu in spec.mig_gpus or not spec.sharing:
                    raise AllocationError(f"{spec.name} GPU {gpu} does not allow sharing")
                if state.owner[gpu] is not None or key in taken:
                    raise AllocationError(f"{spec.name} GPU {gpu} is allocated whole")
                used, used_memory = shares.get(key, (state.share_used[gpu], state.share_memory_used[gpu]))
                used += pod.share.fraction
                used_memory += pod.share.memory_gb
                if used > 1.0 + EPSILON:
                    raise AllocationError(f"{spec.name} GPU {gpu}: compute share would be {used:.3f} > 1")
                if used_memory > spec.gpu_memory_gb + EPSILON:
                    raise AllocationError(
                        f"{spec.name} GPU {gpu}: memory {used_memory:g} GB > {spec.gpu_memory_gb:g} GB"
                    )
                shares[key] = (used, used_memory)
            if pod.mig is not None:
                gpu = pod.mig.gpu
                if gpu not in spec.mig_gpus:
                    raise AllocationError(f"{spec.name} GPU {gpu} is not in MIG mode")
                try:
                    profile = profile_for(spec.gpu_model, pod.mig.profile)
                except MigError as error:
                    raise AllocationError(str(error)) from None
                if pod.mig.start not in profile.starts:
                    raise AllocationError(f"{pod.mig.profile} cannot start at slot {pod.mig.start}")
                key = (pod.node, gpu)
                mask = masks.get(key, state.mig_mask[gpu])
                if mask & profile.mask(pod.mig.start):
                    raise AllocationError(f"{spec.name} GPU {gpu}: MIG slot {pod.mig.start} is already allocated")
                masks[key] = mask | profile.mask(pod.mig.start)
                if masks[key] >= 1 << MIG_SLOTS:
                    raise AllocationError("MIG slice beyond the GPU's slots")
            cpu[pod.node] = cpu.get(pod.node, 0) + pod.cpu_milli
            memory[pod.node] = memory.get(pod.node, 0) + pod.memory_mib
        for node, used in cpu.items():
            if used > self.nodes[node].cpu_free:
                raise AllocationError(f"{self.spec.nodes[node].name}: CPU {used}m > {self.nodes[node].cpu_free}m free")
        for node, used in memory.items():
            if used > self.nodes[node].memory_free:
                raise AllocationError(f"{self.spec.nodes[node].name}: memory {used} MiB > free")

    def release(self, job_id: str) -> Placement:
        """Return a job's resources; releasing an unknown job is an error (it would hide a double release)."""
        placement = self.allocations.pop(job_id, None)
        if placement is None:
            raise AllocationError(f"job {job_id} holds no allocation")
        for pod in placement.pods:
            state = self.nodes[pod.node]
            before = len(state.free_gpus)
            for gpu in pod.gpus:
                state.owner[gpu] = None
                state.free_gpus.add(gpu)
            if pod.share is not None:
                gpu = pod.share.gpu
                del state.share_holders[gpu][f"{job_id}/{pod.pod}"]
                state.share_used[gpu] -= pod.share.fraction
                state.share_memory_used[gpu] -= pod.share.memory_gb
                if not state.share_holders[gpu]:
                    state.share_used[gpu] = 0.0
                    state.share_memory_used[gpu] = 0.0
                    state.free_gpus.add(gpu)
            if pod.mig is not None:
                profile = profile_for(self.spec.nodes[pod.node].gpu_model, pod.mig.profile)
                state.mig_mask[pod.mig.gpu] &= ~profile.mask(pod.mig.start)
                del state.mig_holders[pod.mig.gpu][f"{job_id}/{pod.pod}"]
            state.cpu_free += pod.cpu_milli
            state.memory_free += pod.memory_mib
            self._set_free(pod.node, before, len(state.free_gpus))
            self.allocated_capacity -= _capacity_of(pod)
        if not self.allocations:
            self.allocated_capacity = 0.0  # no float residue once nothing is held
        return placement

    def audit(self) -> list[str]:
        """Every broken invariant, as text (empty when sound); tests call it after every event."""
        problems: list[str] = []
        seen: dict[tuple[int, int], str] = {}
        for job, placement in self.allocations.items():
            for pod in placement.pods:
                for gpu in pod.gpus:
                    key = (pod.node, gpu)
                    if key in seen:
                        problems.append(f"GPU {key} held by {seen[key]} and {job}")
                    seen[key] = job
        free_total = 0
        for index, node in enumerate(self.spec.nodes):
            state = self.nodes[index]
            free_total += len(state.free_gpus)
            if index not in self.by_free[len(state.free_gpus)]:
                problems.append(f"node {index} missing from the free index")
            if state.cpu_free < 0 or state.memory_free < 0:
                problems.append(f"node {index} CPU or memory over capacity")
            for gpu in range(node.gpus):
                if state.share_used[gpu] > 1.0 + EPSILON or state.share_memory_used[gpu] > node.gpu_memory_gb + EPSILON:
                    problems.append(f"node {index} GPU {gpu} share over its cap")
                if state.owner[gpu] is not None and (state.share_holders[gpu] or gpu in state.free_gpus):
                    problems.append(f"node {index} GPU {gpu} whole-allocated and shared or free")
        if free_total != self.free_whole:
            problems.append(f"free GPU count {self.free_whole} != {free_total}")
        if abs(self.allocated_capacity - self.count_allocated_gpus()) > 1e-6:
            problems.append(f"allocated capacity {self.allocated_capacity} != {self.count_allocated_gpus()}")
        for index in range(len(self.spec.nodes)):
            level = len(self.nodes[index].free_gpus)
            signature = self.occupancy_signature(index)
            if index not in self.classes[level].get(signature, ()):
                problems.append(f"node {index} missing from its occupancy class")
        classified = [node for level in self.classes for members in level.values() for node in members]
        if sorted(classified) != list(range(len(self.spec.nodes))):
            problems.append("occupancy classes do not hold every node exactly once")
        return problems


def _capacity_of(pod: PodPlacement) -> float:
    """GPU capacity one pod holds: whole GPUs, its share, or its MIG slice's compute (of 7)."""
    if pod.share is not None:
        return pod.share.fraction
    if pod.mig is not None:
        return int(pod.mig.profile.split("g.")[0]) / 7.0
    return float(len(pod.gpus))


def nodes_with_free(state: ClusterState, at_least: int) -> Iterable[int]:
    """Node indices with at least `at_least` fully free GPUs (any order)."""
    for count in range(at_least, state.max_gpus + 1):
        yield from state.by_free[count]


def rack_nodes(state: ClusterState) -> Sequence[Sequence[int]]:
    return list(state.racks.values())
