"""Placement strategies: where a gang's pods go, or a structured reason why they cannot go anywhere.

`place_gang` never mutates the cluster: it returns a `Placement` to hand to `ClusterState.allocate`
(which re-checks it) or a `PendingReason` that an Explain call can show. Strategies:

- `spread`: least allocated node first (kube-scheduler's default scoring).
- `best-fit`: most allocated node that fits, then the fullest GPU that fits.
- `first-fit`: lowest node index that fits, lowest GPU index.
- `kumiki`: topology-aware gangs (one NVLink island, else one node, else one rack, else anywhere;
  all or nothing) and fragmentation-aware packing of fractional and MIG pods: choose the GPU whose
  use leaves the most capacity usable by the expected mix of future requests (FGD, ATC'23).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TypeVar, cast

from kumiki.sched.cluster import EPSILON, ClusterState, GpuShare, MigSlice, NodeSpec, Placement, PodPlacement
from kumiki.sched.fragmentation import DEFAULT_MIX, RequestMix, node_fragmentation
from kumiki.sched.jobs import GangRequest, PodRequest
from kumiki.sched.mig import MIG_PROFILES, MigError, MigProfile, free_starts, profile_for, usable_capacity

STRATEGIES = ("spread", "best-fit", "first-fit", "kumiki")


@dataclass(frozen=True, slots=True)
class PendingReason:
    """Why a gang cannot be placed now: the blocking resource, the constraint, the node shape it needs."""

    job_id: str
    resource: str
    constraint: str
    node_shape: str
    detail: str = ""

    def explain(self) -> str:
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.job_id}: {self.resource}: {self.constraint} (needs {self.node_shape}){detail}"


@dataclass(slots=True)
class _Scratch:
    """Tentative use by the pods of this gang already placed, on top of the cluster state."""

    gpus: dict[int, set[int]] = field(default_factory=dict)
    shares: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)
    mig: dict[tuple[int, int], int] = field(default_factory=dict)
    cpu: dict[int, int] = field(default_factory=dict)
    memory: dict[int, int] = field(default_factory=dict)

    def take(self, pod: PodPlacement) -> None:
        self.gpus.setdefault(pod.node, set()).update(pod.gpus)
        if pod.share is not None:
            key = (pod.node, pod.share.gpu)
            used, memory = self.shares.get(key, (0.0, 0.0))
            self.shares[key] = (used + pod.share.fraction, memory + pod.share.memory_gb)
            self.gpus[pod.node].add(pod.share.gpu)
        self.cpu[pod.node] = self.cpu.get(pod.node, 0) + pod.cpu_milli
        self.memory[pod.node] = self.memory.get(pod.node, 0) + pod.memory_mib


_MISSING = object()
_Answer = TypeVar("_Answer")
# Remembered answers per request mix; cleared when full (a cluster has far fewer occupancy classes).
MEMO_LIMIT = 65_536


class _Placer:
    def __init__(
        self,
        state: ClusterState,
        strategy: str,
        mix: RequestMix,
        excluded: frozenset[int],
        domain: frozenset[int] | None,
        *,
        by_class: bool = True,
        distinct: bool = False,
    ) -> None:
        self.state = state
        self.strategy = strategy
        self.mix = mix
        self.excluded = excluded | state.cordoned if state.cordoned else excluded
        self.domain = domain
        self.by_class = by_class
        self.distinct = distinct  # a node this gang already uses takes none of its other pods
        self.scratch = _Scratch()
        # answers that depend only on a node's occupancy class or on pure inputs, kept with the state per mix
        self.memo = state.memo.setdefault(mix, {})
        self._domain_levels: list[list[int]] | None = None

    # ---- candidates ----------------------------------------------------------------------------
    def _skip(self, node: int) -> bool:
        return node in self.excluded or node in self.scratch.cpu

    def level_nodes(self, level: int) -> list[int]:
        """Nodes with `level` free whole GPUs worth scoring: inside a domain all of them; otherwise the first
        node of each occupancy class plus the nodes this gang already uses (they differ from their class)."""
        if self.domain is not None:
            if self._domain_levels is None:  # the state does not change while a placer lives
                self._domain_levels = [[] for _ in range(self.state.max_gpus + 1)]
                for node in sorted(self.domain - self.excluded):
                    self._domain_levels[self.state.free_count(node)].append(node)
            return self._domain_levels[level]
        if not self.by_class:
            return sorted(node for node in self.state.by_free[level] if node not in self.excluded)
        nodes = list(self.state.class_representatives(level, self._skip))
        nodes.extend(
            node for node in self.scratch.cpu if node not in self.excluded and self.state.free_count(node) == level
        )
        nodes.sort()
        return nodes

    def candidate_nodes(self) -> list[int]:
        """level_nodes over every level, ascending by node index."""
        return sorted(node for level in range(self.state.max_gpus + 1) for node in self.level_nodes(level))

    # ---- helpers -------------------------------------------------------------------------------
    def free_gpus(self, node: int) -> set[int]:
        free = self.state.nodes[node].free_gpus
        used = self.scratch.gpus.get(node)
        return free - used if used else free

    def host_ok(self, node: int, pod: PodRequest) -> bool:
        if self.distinct and node in self.scratch.cpu:  # every placed pod of the gang is in scratch.cpu
            return False
        spec = self.state.spec.nodes[node]
        if pod.gpu_model and pod.gpu_model != spec.gpu_model:
            return False
        if pod.node_rules and not pod.admits(spec.name):
            return False
        state = self.state.nodes[node]
        return (
            state.cpu_free - self.scratch.cpu.get(node, 0) >= pod.cpu_milli
            and state.memory_free - self.scratch.memory.get(node, 0) >= pod.memory_mib
        )

    def share_free(self, node: int, gpu: int) -> tuple[float, float]:
        """(compute, memory) still free on a shareable card, counting this gang's tentative pods."""
        spec = self.state.spec.nodes[node]
        state = self.state.nodes[node]
        blocked = gpu in spec.mig_gpus or state.owner[gpu] is not None or gpu in self.scratch.gpus.get(node, ())
        if blocked and (node, gpu) not in self.scratch.shares:
            return 0.0, 0.0
        used, memory = self.scratch.shares.get((node, gpu), (0.0, 0.0))
        return (
            1.0 - state.share_used[gpu] - used,
            spec.gpu_memory_gb - state.share_memory_used[gpu] - memory,
        )

    # ---- whole GPUs ----------------------------------------------------------------------------
    def whole_candidates(self, pod: PodRequest) -> list[tuple[int, int]]:
        """(free GPUs, node) of nodes that can take the pod, visiting the index in strategy order."""
        need = pod.gpus
        levels = range(need, self.state.max_gpus + 1)
        ordered = reversed(levels) if self.strategy == "spread" else levels
        found: list[tuple[int, int]] = []
        can_stop = self.strategy in ("best-fit", "spread", "kumiki") and not self.scratch.gpus
        for level in ordered:
            for node in self.level_nodes(level):
                free = level - len(self.scratch.gpus.get(node, ()))
                if free >= need and self.host_ok(node, pod):
                    found.append((free, node))
            if not found or not can_stop:
                continue
            # stop at the first level holding the kind of node the pod is placed on by preference
            preferred = [node for _, node in found if not self.state.kept_for_shares[node]]
            if self.strategy != "kumiki" and preferred:
                break
            if any(self.island_fit(node, need) for node in preferred):
                break
        return found

    def island_fit(self, node: int, need: int) -> bool:
        free = self.free_gpus(node)
        return any(sum(1 for gpu in island if gpu in free) >= need for island in self.state.spec.nodes[node].islands())

    def pick_gpus(self, node: int, need: int) -> tuple[int, ...]:
        free = self.free_gpus(node)
        if self.strategy != "kumiki":
            return tuple(sorted(free)[:need])
        islands = [sorted(gpu for gpu in island if gpu in free) for island in self.state.spec.nodes[node].islands()]
        fitting = [island for island in islands if len(island) >= need]
        if fitting:  # best-fit island: keep the roomiest islands whole for bigger pods
            return tuple(min(fitting, key=lambda island: (len(island), island[0]))[:need])
        chosen: list[int] = []
        for island in sorted(islands, key=lambda island: (-len(island), island[:1])):
            chosen.extend(island[: need - len(chosen)])
            if len(chosen) == need:
                break
        return tuple(sorted(chosen))

    def place_whole(self, index: int, pod: PodRequest) -> PodPlacement | None:
        found = self.whole_candidates(pod)
        if not found:
            return None
        kept = self.state.kept_for_shares  # every strategy takes these last
        if self.strategy == "spread":
            _, node = min(found, key=lambda item: (kept[item[1]], -item[0], item[1]))
        elif self.strategy == "first-fit":
            _, node = min(found, key=lambda item: (kept[item[1]], item[1]))
        elif self.strategy == "kumiki":
            _, node = min(
                found, key=lambda item: (kept[item[1]], not self.island_fit(item[1], pod.gpus), item[0], item[1])
            )
        else:
            _, node = min(found, key=lambda item: (kept[item[1]], item[0], item[1]))
        return PodPlacement(
            index, node, self.pick_gpus(node, pod.gpus), cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib
        )

    # ---- shared GPUs ---------------------------------------------------------------------------
    def node_free_shares(self, node: int) -> list[float]:
        spec = self.state.spec.nodes[node]
        return [max(0.0, self.share_free(node, gpu)[0]) for gpu in range(spec.gpus) if gpu not in spec.mig_gpus]

    def remembered(self, node: int, question: Hashable, answer: Callable[[], _Answer]) -> _Answer:
        """`answer()` for a node, remembered across calls by the node's occupancy class: nodes of one class
        answer alike, and a class is its whole content, so a remembered answer never goes stale."""
        if not self.by_class or node in self.scratch.cpu:  # this gang's tentative pods change the node
            return answer()
        return self.recall((self.state.class_of[node], question, self.strategy), answer)

    def recall(self, key: Hashable, compute: Callable[[], _Answer]) -> _Answer:
        """`compute()`, remembered under `key`, which must name everything the answer depends on."""
        found = self.memo.get(key, _MISSING)
        if found is _MISSING:
            if len(self.memo) >= MEMO_LIMIT:
                self.memo.clear()
            found = self.memo[key] = compute()
        return cast(_Answer, found)

    def share_options(self, node: int, pod: PodRequest) -> tuple[tuple[tuple[float, ...], int], ...]:
        """(score, card) for the cards of `node` that can take `pod`, in card order; `kumiki` keeps the best."""
        spec = self.state.spec.nodes[node]
        if not self.host_ok(node, pod):
            return ()
        gpus = [
            (gpu, free)
            for gpu in range(spec.gpus)
            if gpu not in spec.mig_gpus
            for free, memory in [self.share_free(node, gpu)]
            if free >= pod.gpu_fraction - EPSILON and memory >= pod.gpu_memory_gb - EPSILON
        ]
        if not gpus:
            return ()
        shares = self.node_free_shares(node)
        node_free = round(sum(shares), 9)  # float sums of shares tie as exact ones
        options = tuple(
            (self.share_key(node, gpu, round(free, 9), node_free, pod, shares)[:-2], gpu) for gpu, free in gpus
        )
        return (min(options),) if self.strategy == "kumiki" else options

    def place_share(self, index: int, pod: PodRequest) -> PodPlacement | None:
        best: tuple[tuple[float, ...], int, int] | None = None
        for node in self.candidate_nodes():
            if not self.state.spec.nodes[node].sharing:
                continue
            for prefix, gpu in self.remembered(node, ("share", pod), partial(self.share_options, node, pod)):
                key = (*prefix, node, gpu)
                if best is None or key < best[0]:
                    best = (key, node, gpu)
                if self.strategy == "first-fit":
                    break
            if self.strategy == "first-fit" and best is not None:
                break
        if best is None:
            return None
        _, node, gpu = best
        share = GpuShare(gpu, pod.gpu_fraction, pod.gpu_memory_gb)
        return PodPlacement(index, node, share=share, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)

    def fragmentation(self, shares: Sequence[float], cpu: int, memory: int, gpu_model: str) -> float:
        return self.recall(
            ("fragmentation", tuple(shares), cpu, memory, gpu_model),
            lambda: node_fragmentation(shares, cpu, memory, gpu_model, self.mix),
        )

    def share_key(
        self, node: int, gpu: int, free: float, node_free: float, pod: PodRequest, node_shares: Sequence[float]
    ) -> tuple[float, ...]:
        if self.strategy == "spread":
            return (-node_free, -free, node, gpu)
        if self.strategy == "first-fit":
            return (node, gpu)
        if self.strategy == "best-fit":
            return (node_free, free, node, gpu)
        spec = self.state.spec.nodes[node]
        state = self.state.nodes[node]
        shares = list(node_shares)
        cpu = state.cpu_free - self.scratch.cpu.get(node, 0)
        memory = state.memory_free - self.scratch.memory.get(node, 0)
        before = self.fragmentation(shares, cpu, memory, spec.gpu_model)
        position = [g for g in range(spec.gpus) if g not in spec.mig_gpus].index(gpu)
        shares[position] -= pod.gpu_fraction
        after = self.fragmentation(shares, cpu - pod.cpu_milli, memory - pod.memory_mib, spec.gpu_model)
        return (round(after - before, 9), node_free, free, node, gpu)

    # ---- MIG -----------------------------------------------------------------------------------
    def place_mig(self, index: int, pod: PodRequest) -> PodPlacement | None:
        best: tuple[tuple[float, ...], int, int, int] | None = None
        mig_mix = {kind.mig_profile: kind.weight for kind in self.mix.types if kind.mig_profile}
        # The choice on one GPU depends only on its model and occupancy, which repeat across a fleet:
        # (model, occupied) -> (fragmentation cost, start) of its best free start, or None when it is full.
        for node in self.candidate_nodes():
            spec = self.state.spec.nodes[node]
            if not spec.mig_gpus:
                continue
            if not self.host_ok(node, pod) or spec.gpu_model not in MIG_PROFILES:
                continue
            try:
                profile = profile_for(spec.gpu_model, pod.mig_profile)
            except MigError:
                continue
            for gpu in sorted(spec.mig_gpus):
                occupied = self.state.nodes[node].mig_mask[gpu] | self.scratch.mig.get((node, gpu), 0)
                choice = self.recall(
                    ("mig", spec.gpu_model, occupied, profile.name, self.strategy),
                    partial(self.mig_choice, spec.gpu_model, occupied, profile, mig_mix),
                )
                if choice is None:
                    continue
                cost, start = choice
                used = bin(occupied).count("1")
                if self.strategy == "spread":
                    key: tuple[float, ...] = (used, node, gpu, start)
                elif self.strategy == "first-fit":
                    key = (node, gpu, start)
                elif self.strategy == "best-fit":
                    key = (-used, node, gpu, start)
                else:
                    key = (cost, -used, node, gpu, start)
                if best is None or key < best[0]:
                    best = (key, node, gpu, start)
            if self.strategy == "first-fit" and best is not None:
                break  # first-fit's key starts with the node: nothing later can beat it
        if best is None:
            return None
        _, node, gpu, start = best
        self.scratch.mig[(node, gpu)] = self.scratch.mig.get((node, gpu), 0) | profile_for(
            self.state.spec.nodes[node].gpu_model, pod.mig_profile
        ).mask(start)
        return PodPlacement(
            index,
            node,
            mig=MigSlice(gpu, pod.mig_profile, start),
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )

    def mig_choice(
        self, gpu_model: str, occupied: int, profile: MigProfile, mig_mix: dict[str, float]
    ) -> tuple[float, int] | None:
        """The best free start for `profile` on a GPU of this model and occupancy, with its cost."""
        starts = free_starts(occupied, profile)
        if not starts:
            return None
        if self.strategy != "kumiki":
            return 0.0, starts[0]
        weights = mig_mix or {name: 1.0 for name in MIG_PROFILES[gpu_model]}
        weights = {name: w for name, w in weights.items() if name in MIG_PROFILES[gpu_model]}
        before = usable_capacity(gpu_model, occupied, weights)
        return min(
            (before - usable_capacity(gpu_model, occupied | profile.mask(start), weights), start) for start in starts
        )

    # ---- CPU-only ------------------------------------------------------------------------------
    def place_cpu(self, index: int, pod: PodRequest) -> PodPlacement | None:
        best: tuple[tuple[float, ...], int] | None = None
        for node in self.candidate_nodes():
            if not self.host_ok(node, pod):
                continue
            cpu = self.state.nodes[node].cpu_free - self.scratch.cpu.get(node, 0)
            if self.strategy == "first-fit":
                best = ((node,), node)
                break
            if self.strategy == "spread":
                key: tuple[float, ...] = (-cpu, node)
            elif self.strategy == "best-fit":
                key = (cpu, node)
            else:  # keep CPU on GPU nodes for GPU pods: least free GPU capacity, then best-fit CPU
                key = (sum(self.node_free_shares(node)), cpu, node)
            if best is None or key < best[0]:
                best = (key, node)
        if best is None:
            return None
        return PodPlacement(index, best[1], cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib)

    def place_pod(self, index: int, pod: PodRequest) -> PodPlacement | None:
        placed = self.place_preferring(index, pod) if pod.node_preference else self.place_any(index, pod)
        if placed is not None:
            self.scratch.take(placed)
        return placed

    def preference_scores(self, pod: PodRequest) -> tuple[dict[int, int], frozenset[int]]:
        """Node index -> the pod's score for it, for the nodes it names that the cluster has (not 0); and those
        nodes."""
        index = self.state.node_index
        scores = {index[name]: score for name, score in pod.node_preference if score and name in index}
        return scores, frozenset(scores)

    def place_any(self, index: int, pod: PodRequest) -> PodPlacement | None:
        if pod.gpus:
            return self.place_whole(index, pod)
        if pod.gpu_fraction:
            return self.place_share(index, pod)
        if pod.mig_profile:
            return self.place_mig(index, pod)
        return self.place_cpu(index, pod)

    def place_preferring(self, index: int, pod: PodRequest) -> PodPlacement | None:
        """The pod on a node of the best score that fits: the nodes of each score in turn, best first, the
        strategy choosing among them as it would among all. The nodes the preferences do not name (score 0, most
        of them) are one tier, placed as without preferences (through the class index where the gang may use
        it, the named nodes skipped), so a preference costs about the nodes it names and never makes a pod wait."""
        scores, named = self.recall(("preference", pod.node_preference), partial(self.preference_scores, pod))
        domain, excluded, levels = self.domain, self.excluded, self._domain_levels
        if domain is not None and len(domain) < len(scores):  # a gang's node or rack: look at its nodes only
            named_here = [(node, scores[node]) for node in domain if node in scores]
        else:
            named_here = [(node, score) for node, score in scores.items() if domain is None or node in domain]
        tiers: dict[int, set[int]] = {}
        for node, score in named_here:
            # a quick no before the strategy's own look: barred, or too few whole GPUs free
            if node not in excluded and len(self.free_gpus(node)) >= pod.gpus:
                tiers.setdefault(score, set()).add(node)
        try:
            for score in sorted({*tiers, 0}, reverse=True):
                if score:
                    self.domain, self.excluded = frozenset(tiers[score]), excluded
                else:
                    self.domain, self.excluded = domain, excluded | named
                self._domain_levels = levels if score == 0 and not named else None
                placed = self.place_any(index, pod)
                if placed is not None:
                    return placed
            return None
        finally:
            self.domain, self.excluded, self._domain_levels = domain, excluded, levels


def _gang_preference(state: ClusterState, request: GangRequest) -> Callable[[int], int]:
    """Node index -> minus the score the gang's pods give the node, summed (0 for every node without
    preferences): the first key when choosing which node or rack to keep a gang in."""
    scores: dict[str, int] = {}
    for pod in request.pods:
        for name, score in pod.node_preference:
            scores[name] = scores.get(name, 0) + score
    if not scores:
        return lambda node: 0
    return lambda node: -scores.get(state.spec.nodes[node].name, 0)


def _domains(state: ClusterState, request: GangRequest, strategy: str) -> list[frozenset[int] | None]:
    """Topology domains to try in order: one node, then one rack (fullest that could fit), then all (a gang
    whose pods need distinct nodes skips the single nodes). The pods' preferences come before fullness: the
    nodes they prefer most, and the racks holding the node they prefer most.

    A required topology keeps only the domains that honour it, all of them, fullest first."""
    required = request.required_topology
    whole = sum(pod.gpus for pod in request.pods)
    rank = _gang_preference(state, request)
    if required in ("node", "nvlink_island"):
        singles = [
            node
            for level in range(min(whole, state.max_gpus + 1), state.max_gpus + 1)
            for node in sorted(state.by_free[level])
        ]
        return [frozenset((node,)) for node in sorted(singles, key=rank)]  # stable: fullest first between equals
    if required != "rack" and (strategy != "kumiki" or len(request.pods) < 2):
        return [None]
    domains: list[frozenset[int] | None] = []
    if required != "rack" and whole and whole <= state.max_gpus and not request.distinct_nodes:
        fullest = sorted(
            (rank(node), level, node) for level in range(whole, state.max_gpus + 1) for node in state.by_free[level]
        )
        domains.extend(frozenset((node,)) for _, _, node in fullest[:3])
    if len(state.racks) > 1 or required == "rack":
        racks = []
        for nodes in state.racks.values():
            free = sum(state.free_count(node) for node in nodes)
            if free >= whole:
                racks.append((min(rank(node) for node in nodes), free, nodes[0], frozenset(nodes)))
        domains.extend(nodes for *_, nodes in sorted(racks, key=lambda item: item[:3]))
    if not required:
        domains.append(None)
    return domains


def _within_one_island(state: ClusterState, placement: Placement) -> bool:
    """Every GPU of the placement (whole, share or MIG) sits in one NVLink island of one node."""
    if len(placement.nodes) != 1:
        return False
    gpus: set[int] = set()
    for pod in placement.pods:
        gpus.update(pod.gpus)
        if pod.share is not None:
            gpus.add(pod.share.gpu)
        if pod.mig is not None:
            gpus.add(pod.mig.gpu)
    return any(gpus <= set(island) for island in state.spec.nodes[placement.nodes[0]].islands())


TOPOLOGY_UNMET = {
    "nvlink_island": "required one NVLink island, the free GPUs span islands",
    "node": "required one node, no single node has the GPUs free",
    "rack": "required one rack, the free GPUs that fit are in several racks",
}


def place_gang(
    state: ClusterState,
    request: GangRequest,
    strategy: str,
    *,
    mix: RequestMix = DEFAULT_MIX,
    excluded_nodes: frozenset[int] = frozenset(),
    explain: bool = True,
    by_class: bool = True,
) -> Placement | PendingReason:
    """Place all pods of a gang (at least `min_members`) or explain why not; never changes `state`.

    `by_class=False` scores every node instead of one per occupancy class: the reference the class
    index is tested against (it must never change a choice)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown placement strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    order = sorted(range(len(request.pods)), key=lambda i: (-request.pods[i].gpu_demand, i))
    if by_class and any(pod.node_rules for pod in request.pods):
        by_class = False  # nodes of one occupancy class may differ in what the pod's rules admit: score each
    distinct = request.distinct_nodes
    for domain in _domains(state, request, strategy):
        placer = _Placer(state, strategy, mix, excluded_nodes, domain, by_class=by_class, distinct=distinct)
        placed: list[PodPlacement] = []
        for index in order:
            pod = placer.place_pod(index, request.pods[index])
            if pod is not None:
                placed.append(pod)
        if len(placed) >= request.required:
            # an elastic gang (min_members < pods) keeps every member that fits
            placement = Placement(request.job_id, tuple(sorted(placed, key=lambda pod: pod.pod)))
            if request.required_topology != "nvlink_island" or _within_one_island(state, placement):
                return placement
    if not explain:  # hot path of a scheduling pass: the caller only needs "no"
        return PendingReason(request.job_id, "gpu", "does not fit now", request.pods[0].shape())
    for relaxed, resource, constraint, detail in _relaxations(request):
        if isinstance(
            place_gang(state, relaxed, strategy, mix=mix, excluded_nodes=excluded_nodes, explain=False), Placement
        ):
            return PendingReason(request.job_id, resource, constraint, request.pods[0].shape(), detail)
    return _explain(state, request, strategy, mix, excluded_nodes)


def _relaxations(request: GangRequest) -> list[tuple[GangRequest, str, str, str]]:
    """The gang without each of its topology constraints, and the reason to give if it then fits."""
    relaxed = []
    if request.required_topology:
        relaxed.append((
            replace(request, required_topology=""),
            f"topology:{request.required_topology}",
            TOPOLOGY_UNMET[request.required_topology],
            "the gang fits the cluster only by spreading wider",
        ))  # fmt: skip
    if request.distinct_nodes:
        relaxed.append((
            replace(request, distinct_nodes=False),
            "topology:distinct_nodes",
            f"each of the {request.required} pods needs a node of its own (pod anti-affinity), and the room"
            " that fits them is on fewer nodes",
            "the gang fits the cluster only with pods sharing a node",
        ))  # fmt: skip
    return relaxed


def _explain(
    state: ClusterState, request: GangRequest, strategy: str, mix: RequestMix, excluded: frozenset[int]
) -> PendingReason:
    if excluded:  # the reservation is the reason only when nothing else is in the way
        if isinstance(place_gang(state, request, strategy, mix=mix, explain=False), Placement):
            return PendingReason(
                request.job_id,
                "reservation",
                f"fits only on {len(excluded)} node(s) reserved for another job",
                max(request.pods, key=lambda pod: pod.gpu_demand).shape(),
            )
        excluded = frozenset()
    biggest = max(request.pods, key=lambda pod: pod.gpu_demand)
    shapes = {node.shape() for node in dict.fromkeys(state.spec.nodes)}
    fitting = 0
    alone = _Placer(state, strategy, mix, excluded, None)
    together = _Placer(state, strategy, mix, excluded, None, distinct=request.distinct_nodes)
    for index, pod in enumerate(request.pods):
        if together.place_pod(index, pod) is not None:
            fitting += 1
    if fitting and len(request.pods) > 1:
        return PendingReason(
            request.job_id,
            "gpu",
            f"gang all-or-nothing: only {fitting} of {request.required} pods fit at once",
            biggest.shape(),
            f"{state.free_whole} whole GPUs free in the cluster",
        )
    pod = biggest
    models = {node.gpu_model for node in state.spec.nodes}
    if pod.gpu_model and pod.gpu_model not in models:
        return PendingReason(request.job_id, "gpu_model", f"no node has GPU model {pod.gpu_model}", pod.shape())
    hosts = [node for node in range(len(state.spec.nodes)) if alone.host_ok(node, pod)]
    if not hosts:
        resource = "cpu" if all(state.cpu_free(n) < pod.cpu_milli for n in range(len(state.spec.nodes))) else "memory"
        return PendingReason(
            request.job_id,
            resource,
            f"no node has {pod.cpu_milli}m CPU and {pod.memory_mib} MiB free",
            pod.shape(),
        )
    if pod.gpus:
        most = max((state.free_count(node) for node in hosts), default=0)
        return PendingReason(
            request.job_id,
            "gpu",
            f"no node has {pod.gpus} free whole GPUs (most free on one node: {most})",
            pod.shape(),
            f"node shapes: {'; '.join(sorted(shapes))}",
        )
    if pod.mig_profile:
        return PendingReason(
            request.job_id, "mig", f"no MIG GPU has a free valid slot for {pod.mig_profile}", pod.shape()
        )
    return PendingReason(
        request.job_id,
        "gpu_share",
        f"no shareable GPU has {pod.gpu_fraction:g} compute and {pod.gpu_memory_gb:g} GB free",
        pod.shape(),
    )


def could_host(spec: NodeSpec, pod: PodRequest) -> bool:
    """Whether the node could take the pod were it empty: a reservation on any other node is wasted."""
    if pod.gpu_model and pod.gpu_model != spec.gpu_model:
        return False
    if pod.node_rules and not pod.admits(spec.name):
        return False
    if pod.cpu_milli > spec.cpu_milli or pod.memory_mib > spec.memory_mib:
        return False
    whole = spec.gpus - len(spec.mig_gpus)
    if pod.gpus:
        return pod.gpus <= whole
    if pod.gpu_fraction:
        return spec.sharing and whole > 0 and pod.gpu_memory_gb <= spec.gpu_memory_gb + EPSILON
    if pod.mig_profile:
        try:
            profile_for(spec.gpu_model, pod.mig_profile)
        except MigError:
            return False
        return bool(spec.mig_gpus)
    return True
