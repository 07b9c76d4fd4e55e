"""Placement's pure core: the allocation book of the live cluster.

It wraps the scheduling core (`kumiki.sched`: the simulator's very placement code) with what a live
service needs and a simulator does not: nodes that come, change, turn unhealthy and go; binds that are
idempotent per (job, generation); a table that can be rebuilt from the events it published; pending
jobs that are retried when capacity frees up; and Explain. No I/O: adapters publish and persist.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from kumiki.sched.cluster import AllocationError, ClusterSpec, ClusterState, NodeSpec, Placement, PodPlacement
from kumiki.sched.jobs import GangRequest
from kumiki.sched.placement import PendingReason, place_gang


class BindConflict(ValueError):
    """A bind that contradicts the book (an older generation, or a new one while the old still holds GPUs)."""


@dataclass(frozen=True, slots=True)
class BindCommand:
    """One Bind request in core terms. `generation` makes binds idempotent and orders attempts."""

    job_id: str
    generation: int
    queue: str
    request: GangRequest
    priority_tier: int = 0
    preemptible: bool = False
    user: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True)
class BoundJob:
    command: BindCommand
    placement: Placement
    node_names: tuple[str, ...]  # per pod of `placement.pods`: names survive node re-indexing


@dataclass(frozen=True, slots=True)
class PendingJob:
    command: BindCommand
    reason: PendingReason
    sequence: int  # arrival order within the book, for FIFO inside a priority tier


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """Bound (placement set, `replayed` when this answers a repeated request) or pending (reason set)."""

    job: BoundJob | None = None
    reason: PendingReason | None = None
    replayed: bool = False

    @property
    def bound(self) -> bool:
        return self.job is not None


@dataclass(frozen=True, slots=True)
class Explanation:
    status: str  # "bound", "pending" or "unknown"
    queue: str = ""
    reasons: tuple[PendingReason, ...] = ()
    queue_position: int = 0
    job: BoundJob | None = None


@dataclass
class PlacementBook:
    """Nodes, allocations and pending jobs. Mutated only through its methods, on one thread."""

    strategy: str = "kumiki"
    nodes: list[NodeSpec] = field(default_factory=list)
    healthy: list[bool] = field(default_factory=list)
    index_of: dict[str, int] = field(default_factory=dict)
    _state: ClusterState = field(default_factory=lambda: ClusterState.empty(ClusterSpec(())))
    _stale: bool = False  # nodes were added since _state was built: rebuild on next use
    bound: dict[str, BoundJob] = field(default_factory=dict)
    pending: dict[str, PendingJob] = field(default_factory=dict)
    orphans: dict[str, BoundJob] = field(default_factory=dict)  # bound on nodes not (yet) known
    _sequence: int = 0
    _excluded: frozenset[int] | None = None  # unhealthy node indices, recomputed after a health change

    @property
    def state(self) -> ClusterState:
        """The allocation state; adding nodes only marks it stale, so replaying 1,000 nodes is one rebuild."""
        if self._stale:
            self._stale = False
            displaced = self._rebuild_state()
            assert not displaced, "adding nodes cannot displace allocations"
        return self._state

    # ---- nodes ---------------------------------------------------------------------------------
    def upsert_node(self, spec: NodeSpec, healthy: bool) -> list[BoundJob]:
        """Add or update a node; returns jobs whose allocation no longer fits the changed node (released)."""
        index = self.index_of.get(spec.name)
        displaced: list[BoundJob] = []
        if index is None:
            self.index_of[spec.name] = len(self.nodes)
            self.nodes.append(spec)
            self.healthy.append(healthy)
            self._excluded = None
            self._stale = True
            if self.orphans:
                self._adopt_orphans()
        else:
            self.healthy[index] = healthy
            self._excluded = None
            if self.nodes[index] != spec:
                self.nodes[index] = spec
                self._stale = False
                displaced = self._rebuild_state()
        return displaced

    def remove_node(self, name: str) -> None:
        """A node that left: it keeps its index (allocations name it) but never receives work again."""
        index = self.index_of.get(name)
        if index is not None:
            self.healthy[index] = False
            self._excluded = None

    def excluded_nodes(self) -> frozenset[int]:
        if self._excluded is None:
            self._excluded = frozenset(index for index, healthy in enumerate(self.healthy) if not healthy)
        return self._excluded

    def _rebuild_state(self) -> list[BoundJob]:
        self._state = ClusterState.empty(ClusterSpec(tuple(self.nodes)))
        displaced = []
        for job_id, job in list(self.bound.items()):
            try:
                self._state.allocate(job.placement)
            except AllocationError:
                del self.bound[job_id]
                displaced.append(job)
        return displaced

    def _adopt_orphans(self) -> None:
        for job_id, job in list(self.orphans.items()):
            if all(name in self.index_of for name in job.node_names):
                del self.orphans[job_id]
                self.restore(
                    job.command, [(name, pod) for name, pod in zip(job.node_names, job.placement.pods, strict=True)]
                )

    # ---- binds ---------------------------------------------------------------------------------
    def bind(self, command: BindCommand) -> BindOutcome:
        """Place a gang whole or not at all; a repeated (job, generation) gets the same answer."""
        current = self.bound.get(command.job_id)
        if current is not None:
            if current.command.generation == command.generation:
                return BindOutcome(job=current, replayed=True)
            if current.command.generation > command.generation:
                raise BindConflict(
                    f"job.generation: {command.generation} is older than the bound generation "
                    f"{current.command.generation}"
                )
            raise BindConflict(
                f"job.generation: generation {current.command.generation} still holds an allocation; release it first"
            )
        found = self._place(command, explain=True)
        if isinstance(found, PendingReason):
            self._remember_pending(command, found)
            return BindOutcome(reason=found)
        return BindOutcome(job=self._allocate(command, found))

    def _place(self, command: BindCommand, *, explain: bool) -> Placement | PendingReason:
        if not self.nodes:
            return PendingReason(command.job_id, "nodes", "the cluster has no nodes yet", "any node")
        return place_gang(
            self.state, command.request, self.strategy, excluded_nodes=self.excluded_nodes(), explain=explain
        )

    def _allocate(self, command: BindCommand, placement: Placement) -> BoundJob:
        self.state.allocate(placement)  # re-checks every GPU, slice and cap
        job = BoundJob(command, placement, tuple(self.nodes[pod.node].name for pod in placement.pods))
        self.bound[command.job_id] = job
        self.pending.pop(command.job_id, None)
        return job

    def hold(self, command: BindCommand, reason: PendingReason) -> None:
        """Keep a job pending for a reason found outside the book (quota admission)."""
        self._remember_pending(command, reason)

    def _remember_pending(self, command: BindCommand, reason: PendingReason) -> None:
        previous = self.pending.get(command.job_id)
        if previous is None:
            self._sequence += 1
        sequence = previous.sequence if previous else self._sequence
        self.pending[command.job_id] = PendingJob(command, reason, sequence)

    def unbind(self, job_id: str) -> BoundJob:
        """Undo an allocation that could not be made durable (its event was not acknowledged)."""
        job = self.bound.pop(job_id)
        self.state.release(job_id)
        return job

    def release(self, job_id: str, generation: int) -> BoundJob | None:
        """Free a job's allocation; None when it holds none for that generation (releasing twice is fine)."""
        self.pending.pop(job_id, None)
        job = self.bound.get(job_id)
        if job is None or (generation and job.command.generation != generation):
            return None
        del self.bound[job_id]
        self.state.release(job_id)
        return job

    def withdraw(self, job_id: str) -> bool:
        """Forget a pending job (cancelled before it was bound)."""
        return self.pending.pop(job_id, None) is not None

    def restore(self, command: BindCommand, pods: Iterable[tuple[str, PodPlacement]]) -> BoundJob | None:
        """Re-apply a bind from the event log (node given by name); None if it is already in the book."""
        if command.job_id in self.bound:
            return None
        named = list(pods)
        if not all(name in self.index_of for name, _ in named):
            names = tuple(name for name, _ in named)
            placement = Placement(command.job_id, tuple(pod for _, pod in named))
            self.orphans[command.job_id] = BoundJob(command, placement, names)
            return None
        placement = Placement(command.job_id, tuple(replace(pod, node=self.index_of[name]) for name, pod in named))
        return self._allocate(command, placement)

    def forget(self, job_id: str) -> None:
        """Drop a job from the book during a rebuild (it was released)."""
        self.orphans.pop(job_id, None)
        self.pending.pop(job_id, None)
        if job_id in self.bound:
            del self.bound[job_id]
            self.state.release(job_id)

    # ---- scheduling cycle ---------------------------------------------------------------------
    def pending_in_order(self) -> list[PendingJob]:
        """Higher priority tiers first, then arrival order (FIFO within a tier)."""
        return sorted(self.pending.values(), key=lambda job: (-job.command.priority_tier, job.sequence))

    def try_pending(self, job_id: str) -> BoundJob | None:
        """Bind a pending job if it fits now (the scheduling cycle's step; no reason is computed)."""
        pending = self.pending.get(job_id)
        if pending is None:
            return None
        found = self._place(pending.command, explain=False)
        return self._allocate(pending.command, found) if isinstance(found, Placement) else None

    # ---- explain -----------------------------------------------------------------------------------
    def explain(self, job_id: str) -> Explanation:
        job = self.bound.get(job_id)
        if job is not None:
            return Explanation("bound", job.command.queue, job=job)
        pending = self.pending.get(job_id)
        if pending is None:
            return Explanation("unknown")
        fresh = self._place(pending.command, explain=True)
        reasons = (fresh,) if isinstance(fresh, PendingReason) else (pending.reason,)
        same_queue = [item for item in self.pending_in_order() if item.command.queue == pending.command.queue]
        position = 1 + next(index for index, item in enumerate(same_queue) if item.command.job_id == job_id)
        return Explanation("pending", pending.command.queue, reasons, position)

    def audit(self) -> list[str]:
        problems = self.state.audit()
        if set(self.bound) != set(self.state.allocations):
            problems.append("bound jobs and cluster allocations differ")
        return problems
