"""Quota rules, pure: the queue tree and its validation, admission, reclaim victims, hierarchical DRF fair
share with decayed usage, and ledger arithmetic.

The quota service and the simulator call the same functions: state in, decisions out. Nothing here does
I/O or reads a clock; times are passed in (microseconds since the epoch for the ledger, seconds elsewhere).

Semantics in one place:
- A queue's guarantee is GPUs per model plus GPUs of any model (key ""). A job is inside the guarantee when
  its leaf queue's non-borrowed use plus the job fits the guarantee (children's guarantees nest inside their
  parent's, so the leaf decides). Inside the guarantee a job is admitted even when borrowers hold the GPUs:
  the shortfall is reclaimed from them.
- Beyond the guarantee only preemptible work is admitted, as borrowed, and only onto idle GPUs.
- A hard limit caps a whole subtree, borrowed work included.
- Reclaim takes borrowed work only, from the most over-quota queue first, judged where the beneficiary's and
  the victim's paths diverge (the victim's side must be above its guarantee there). A queue within its
  guarantee is protected and never a reason to stop looking elsewhere (kai-scheduler/KAI-Scheduler#1750).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import Enum

from kumiki.common.contracts.v1 import common_pb2, events_pb2, quota_pb2
from kumiki.common.grpcutil import InvalidRequest, require_job

ANY_MODEL = ""
EPSILON = 1e-9


class QueueConfigError(ValueError):
    """A queue file that cannot be applied; the message names the queue (or section) and the field."""

    def __init__(self, where: str, field_name: str, problem: str) -> None:
        super().__init__(f"{where}: {field_name}: {problem}")
        self.where = where
        self.field = field_name


# --- the queue tree ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queue:
    path: str
    parent: str | None
    guarantees: Mapping[str, float] = field(default_factory=dict)  # model ("" = any) -> GPUs
    limit_gpus: float | None = None  # None: no hard limit
    weight: float = 1.0  # over-quota weight: share of idle capacity
    priority_tiers: frozenset[int] = frozenset()  # empty: every tier allowed
    owners: frozenset[str] = frozenset()

    @property
    def guaranteed_gpus(self) -> float:
        return sum(self.guarantees.values())

    @property
    def depth(self) -> int:
        return self.path.count("/")


@dataclass(frozen=True, slots=True)
class Resources:
    """GPUs, CPU (millicores) and memory (MiB): the dimensions dominant-resource fairness compares."""

    gpus: float = 0.0
    cpu_milli: float = 0.0
    memory_mib: float = 0.0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.gpus + other.gpus, self.cpu_milli + other.cpu_milli, self.memory_mib + other.memory_mib)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.gpus - other.gpus, self.cpu_milli - other.cpu_milli, self.memory_mib - other.memory_mib)

    def scaled(self, factor: float) -> Resources:
        return Resources(self.gpus * factor, self.cpu_milli * factor, self.memory_mib * factor)

    def clipped(self) -> Resources:
        return Resources(max(0.0, self.gpus), max(0.0, self.cpu_milli), max(0.0, self.memory_mib))

    def fits_in(self, other: Resources) -> bool:
        return (
            self.gpus <= other.gpus + EPSILON
            and self.cpu_milli <= other.cpu_milli + EPSILON
            and self.memory_mib <= other.memory_mib + EPSILON
        )

    def dominant_share(self, capacity: Resources) -> float:
        shares = [
            value / total
            for value, total in (
                (self.gpus, capacity.gpus),
                (self.cpu_milli, capacity.cpu_milli),
                (self.memory_mib, capacity.memory_mib),
            )
            if total > 0
        ]
        return max(shares, default=0.0)


@dataclass(frozen=True)
class QuotaConfig:
    """The validated queue file: the tree, the cluster's capacity and the price of a GPU-hour per model."""

    queues: Mapping[str, Queue]
    capacity_gpus: Mapping[str, float]  # model -> GPUs in the cluster
    cpu_milli: float = 0.0
    memory_mib: float = 0.0
    rates: Mapping[str, Decimal] = field(default_factory=dict)  # model -> cost per GPU-hour

    def children(self, path: str | None) -> list[Queue]:
        return sorted((queue for queue in self.queues.values() if queue.parent == path), key=lambda q: q.path)

    def is_leaf(self, path: str) -> bool:
        return not any(queue.parent == path for queue in self.queues.values())

    def ancestors(self, path: str) -> list[Queue]:
        """Root first, the queue itself last."""
        chain = []
        current: str | None = path
        while current is not None:
            queue = self.queues[current]
            chain.append(queue)
            current = queue.parent
        return chain[::-1]

    def in_subtree(self, path: str, root: str) -> bool:
        return path == root or path.startswith(root + "/")

    @property
    def total_capacity(self) -> Resources:
        return Resources(sum(self.capacity_gpus.values()), self.cpu_milli, self.memory_mib)


def _number(value: object, where: str, field_name: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise QueueConfigError(where, field_name, f"expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < minimum or (strict and number <= minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise QueueConfigError(where, field_name, f"must be a finite number {bound}, got {value!r}")
    return number


def _guarantees(value: object, where: str) -> dict[str, float]:
    if value is None:
        return {}
    if isinstance(value, int | float) and not isinstance(value, bool):
        return {ANY_MODEL: _number(value, where, "guarantee")}
    if not isinstance(value, dict):
        raise QueueConfigError(where, "guarantee", f"expected a number or a map of GPU model to GPUs, got {value!r}")
    result = {}
    for model, gpus in value.items():
        key = "" if model in ("any", "*", "") else str(model)
        result[key] = _number(gpus, where, f"guarantee.{model}")
    return result


def parse_config(data: object) -> QuotaConfig:
    """Validate a parsed queue file (see docs/examples/queues.yaml); every error names the queue and field.

    Nothing is returned unless the whole file is valid, so a caller that applies the result never applies
    half a file.
    """
    if not isinstance(data, dict):
        raise QueueConfigError("file", "top level", "expected a mapping with cluster, rates and queues")
    unknown = set(data) - {"cluster", "rates", "queues"}
    if unknown:
        raise QueueConfigError("file", sorted(unknown)[0], "unknown section (expected cluster, rates, queues)")
    cluster = data.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise QueueConfigError("cluster", "cluster", "expected a mapping")
    gpus = cluster.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        raise QueueConfigError("cluster", "gpus", "expected a map of GPU model to GPU count")
    capacity = {str(model): _number(count, "cluster", f"gpus.{model}") for model, count in gpus.items()}
    cpu = _number(cluster.get("cpu_milli", 0), "cluster", "cpu_milli")
    memory = _number(cluster.get("memory_mib", 0), "cluster", "memory_mib")
    rates_raw = data.get("rates") or {}
    if not isinstance(rates_raw, dict):
        raise QueueConfigError("rates", "rates", "expected a map of GPU model to cost per GPU-hour")
    rates = {str(model): Decimal(str(_number(rate, "rates", str(model)))) for model, rate in rates_raw.items()}
    entries = data.get("queues")
    if not isinstance(entries, list) or not entries:
        raise QueueConfigError("queues", "queues", "expected a non-empty list of queues")
    queues = [_parse_queue(entry, index) for index, entry in enumerate(entries)]
    return build_config(queues, capacity, cpu_milli=cpu, memory_mib=memory, rates=rates)


def _parse_queue(entry: object, index: int) -> Queue:
    where = f"queues[{index}]"
    if not isinstance(entry, dict):
        raise QueueConfigError(where, "queue", f"expected a mapping, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not name or "/" in name or name != name.strip():
        raise QueueConfigError(where, "name", f"expected a name without '/' or spaces around it, got {name!r}")
    parent = entry.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise QueueConfigError(where, "parent", f"expected the parent queue's path, got {parent!r}")
    path = f"{parent}/{name}" if parent else name
    where = f"queue {path}"
    known = {"name", "parent", "guarantee", "limit", "weight", "priority_tiers", "owners"}
    unknown = set(entry) - known
    if unknown:
        raise QueueConfigError(where, sorted(unknown)[0], f"unknown field (expected {', '.join(sorted(known))})")
    limit = entry.get("limit")
    tiers = entry.get("priority_tiers") or []
    if not isinstance(tiers, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tiers):
        raise QueueConfigError(where, "priority_tiers", f"expected a list of integers, got {tiers!r}")
    owners = entry.get("owners") or []
    if not isinstance(owners, list) or not all(isinstance(o, str) and o for o in owners):
        raise QueueConfigError(where, "owners", f"expected a list of identities, got {owners!r}")
    return Queue(
        path=path,
        parent=parent,
        guarantees=_guarantees(entry.get("guarantee"), where),
        limit_gpus=None if limit is None else _number(limit, where, "limit"),
        weight=_number(entry.get("weight", 1.0), where, "weight", strict=True),
        priority_tiers=frozenset(tiers),
        owners=frozenset(owners),
    )


def build_config(
    queues: Sequence[Queue],
    capacity_gpus: Mapping[str, float],
    *,
    cpu_milli: float = 0.0,
    memory_mib: float = 0.0,
    rates: Mapping[str, Decimal] | None = None,
) -> QuotaConfig:
    """Check the tree's invariants (parents exist, guarantees nest, limits hold guarantees)."""
    by_path: dict[str, Queue] = {}
    for queue in queues:
        if queue.path in by_path:
            raise QueueConfigError(f"queue {queue.path}", "name", "defined twice")
        by_path[queue.path] = queue
    for queue in queues:
        where = f"queue {queue.path}"
        if queue.parent is not None and queue.parent not in by_path:
            raise QueueConfigError(where, "parent", f"unknown parent queue {queue.parent!r}")
        if queue.limit_gpus is not None and queue.guaranteed_gpus > queue.limit_gpus + EPSILON:
            raise QueueConfigError(
                where, "limit", f"{queue.limit_gpus:g} is below the queue's guarantee of {queue.guaranteed_gpus:g}"
            )
        for model in queue.guarantees:
            if model != ANY_MODEL and model not in capacity_gpus:
                raise QueueConfigError(where, f"guarantee.{model}", "GPU model not in cluster.gpus")
    for parent_path in [None, *by_path]:
        children = [queue for queue in queues if queue.parent == parent_path]
        if not children:
            continue
        if parent_path is None:
            parent_total = sum(capacity_gpus.values())
            parent_models: Mapping[str, float] = capacity_gpus
            parent_name = "the cluster"
            parent_field = "cluster.gpus"
        else:
            parent = by_path[parent_path]
            parent_total = parent.guaranteed_gpus
            parent_models = parent.guarantees
            parent_name = f"parent {parent_path}"
            parent_field = "guarantee"
        for child in children:
            where = f"queue {child.path}"
            if child.guaranteed_gpus > parent_total + EPSILON:
                raise QueueConfigError(
                    where,
                    "guarantee",
                    f"{child.guaranteed_gpus:g} GPUs exceed the {parent_field} of {parent_name} ({parent_total:g})",
                )
            for model, gpus in child.guarantees.items():
                allowed = (
                    parent_total
                    if model == ANY_MODEL
                    else parent_models.get(model, 0.0)
                    + (parent_models.get(ANY_MODEL, 0.0) if parent_path is not None else 0.0)
                )
                if gpus > allowed + EPSILON:
                    raise QueueConfigError(
                        where,
                        f"guarantee.{model or 'any'}",
                        f"{gpus:g} GPUs exceed what {parent_name} has for that model ({allowed:g})",
                    )
        total = sum(child.guaranteed_gpus for child in children)
        if total > parent_total + EPSILON:
            raise QueueConfigError(
                f"queue {children[-1].path}" if parent_path is None else f"queue {parent_path}",
                "guarantee",
                f"children's guarantees add up to {total:g} GPUs, more than {parent_name}'s {parent_total:g}",
            )
    return QuotaConfig(dict(by_path), dict(capacity_gpus), cpu_milli, memory_mib, dict(rates or {}))


def flat_config(
    guarantees: Mapping[str, float],
    capacity_gpus: float,
    *,
    weights: Mapping[str, float] | None = None,
    scale: float = 1.0,
) -> QuotaConfig:
    """One level of queues with any-model guarantees (the simulator's Philly VCs): guarantees are multiplied
    by `scale`, so a trace's VC shares fit a smaller simulated cluster."""
    queues = [
        Queue(name, None, {ANY_MODEL: gpus * scale}, weight=(weights or {}).get(name, 1.0))
        for name, gpus in sorted(guarantees.items())
    ]
    return build_config(queues, {ANY_MODEL: capacity_gpus})


# --- admission ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Holding:
    """Admitted work that holds quota (one job, or an aggregate row with job_id empty)."""

    queue: str
    gpus: float
    gpu_model: str = ANY_MODEL
    borrowed: bool = False
    preemptible: bool = True
    priority_tier: int = 0
    job_id: str = ""
    generation: int = 0
    seq: int = 0  # admission order: later admissions lose less work when preempted
    reclaiming: bool = False  # already chosen as a reclaim victim


@dataclass(frozen=True, slots=True)
class AdmitRequest:
    job_id: str
    generation: int
    queue: str
    gpus: float
    gpu_model: str = ANY_MODEL
    priority_tier: int = 0
    preemptible: bool = False


class Outcome(Enum):
    ADMITTED = "admitted"
    BORROWED = "borrowed"
    DENIED = "denied"


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: Outcome
    code: str
    message: str
    resource: str = "gpus"
    shortfall_gpus: float = 0.0  # inside the guarantee but the GPUs are lent out: reclaim this much

    @property
    def admitted(self) -> bool:
        return self.outcome is not Outcome.DENIED


def validate_admit(request: quota_pb2.AdmitRequest) -> None:
    require_job(request.job)
    if not request.queue:
        raise InvalidRequest("queue", "required")
    if not math.isfinite(request.gpus) or request.gpus < 0:
        raise InvalidRequest("gpus", f"must be a finite number >= 0, got {request.gpus}")


def may_submit(config: QuotaConfig, identity: str, path: str) -> bool:
    """An owner of a queue or of any of its ancestors may submit to it."""
    return any(identity in queue.owners for queue in config.ancestors(path))


@dataclass(frozen=True)
class UsageView:
    """What admitted work holds, summed the ways admission needs."""

    subtree: Mapping[str, float]  # queue path -> GPUs held in its subtree (borrowed included)
    guaranteed: Mapping[tuple[str, str], float]  # (leaf, model) -> GPUs held inside the guarantee
    borrowed: Mapping[str, float]  # leaf -> borrowed GPUs
    by_model: Mapping[str, float]  # model -> GPUs held cluster-wide
    total: float


def usage_view(config: QuotaConfig, holdings: Iterable[Holding]) -> UsageView:
    subtree: dict[str, float] = {}
    guaranteed: dict[tuple[str, str], float] = {}
    borrowed: dict[str, float] = {}
    by_model: dict[str, float] = {}
    total = 0.0
    for holding in holdings:
        total += holding.gpus
        by_model[holding.gpu_model] = by_model.get(holding.gpu_model, 0.0) + holding.gpus
        if holding.borrowed:
            borrowed[holding.queue] = borrowed.get(holding.queue, 0.0) + holding.gpus
        else:
            key = (holding.queue, holding.gpu_model)
            guaranteed[key] = guaranteed.get(key, 0.0) + holding.gpus
        if holding.queue in config.queues:
            for queue in config.ancestors(holding.queue):
                subtree[queue.path] = subtree.get(queue.path, 0.0) + holding.gpus
    return UsageView(subtree, guaranteed, borrowed, by_model, total)


def guarantee_headroom(queue: Queue, guaranteed_use: Mapping[str, float], model: str) -> float:
    """GPUs of `model` the queue can still run inside its guarantee.

    Each model's use draws on that model's guarantee first and then on the any-model guarantee; work of no
    particular model draws on the any-model guarantee and then on whatever model guarantee is unused.
    """
    guarantees = queue.guarantees
    overflow = guaranteed_use.get(ANY_MODEL, 0.0)
    unused_specific = 0.0
    for name, gpus in guarantees.items():
        if name == ANY_MODEL:
            continue
        used = guaranteed_use.get(name, 0.0)
        overflow += max(0.0, used - gpus)
        unused_specific += max(0.0, gpus - used)
    for name, used in guaranteed_use.items():
        if name != ANY_MODEL and name not in guarantees:
            overflow += used
    any_free = max(0.0, guarantees.get(ANY_MODEL, 0.0) - overflow)
    spilled = max(0.0, overflow - guarantees.get(ANY_MODEL, 0.0))  # drawn from model guarantees, model unknown
    if model == ANY_MODEL:
        return max(0.0, any_free + unused_specific - spilled)
    own = max(0.0, guarantees.get(model, 0.0) - guaranteed_use.get(model, 0.0))
    return max(0.0, own + any_free - spilled)


def idle_gpus(config: QuotaConfig, view: UsageView, model: str) -> float:
    """GPUs nobody holds: of `model`, and no more than the cluster's idle total."""
    total_idle = sum(config.capacity_gpus.values()) - view.total
    if model == ANY_MODEL:
        return total_idle
    model_idle = config.capacity_gpus.get(model, 0.0) - view.by_model.get(model, 0.0)
    return min(model_idle, total_idle)


def decide_admission(config: QuotaConfig, holdings: Iterable[Holding], request: AdmitRequest) -> Admission:
    """Admit inside the guarantee, borrow idle GPUs for preemptible work beyond it, deny otherwise."""
    queue = config.queues.get(request.queue)
    if queue is None:
        return Admission(Outcome.DENIED, "unknown_queue", f"queue {request.queue!r} does not exist", "queue")
    if not config.is_leaf(queue.path):
        return Admission(
            Outcome.DENIED, "queue_not_leaf", f"queue {queue.path} has child queues; submit to one of them", "queue"
        )
    if queue.priority_tiers and request.priority_tier not in queue.priority_tiers:
        allowed = ", ".join(str(tier) for tier in sorted(queue.priority_tiers))
        return Admission(
            Outcome.DENIED,
            "tier_not_allowed",
            f"queue {queue.path} allows priority tiers {allowed}, not {request.priority_tier}",
            "priority_tier",
        )
    if request.gpu_model != ANY_MODEL and request.gpu_model not in config.capacity_gpus:
        return Admission(
            Outcome.DENIED, "unknown_gpu_model", f"GPU model {request.gpu_model!r} is not in the cluster", "gpu_model"
        )
    view = usage_view(config, holdings)
    for ancestor in config.ancestors(queue.path):
        held = view.subtree.get(ancestor.path, 0.0)
        if ancestor.limit_gpus is not None and held + request.gpus > ancestor.limit_gpus + EPSILON:
            return Admission(
                Outcome.DENIED,
                "limit_exceeded",
                f"queue {ancestor.path} would hold {held + request.gpus:g} GPUs, above its limit of"
                f" {ancestor.limit_gpus:g}",
            )
    own_use = {model: gpus for (path, model), gpus in view.guaranteed.items() if path == queue.path}
    idle = idle_gpus(config, view, request.gpu_model)
    if request.gpus <= guarantee_headroom(queue, own_use, request.gpu_model) + EPSILON:
        shortfall = max(0.0, request.gpus - max(0.0, idle))
        message = f"inside the guarantee of queue {queue.path}"
        if shortfall > EPSILON:
            message += f"; {shortfall:g} GPUs are lent out and will be reclaimed"
        return Admission(Outcome.ADMITTED, "within_guarantee", message, shortfall_gpus=shortfall)
    if not request.preemptible:
        return Admission(
            Outcome.DENIED,
            "quota_exceeded",
            f"queue {queue.path} has no guarantee left for {request.gpus:g} GPUs and only preemptible work may borrow",
        )
    if request.gpus <= idle + EPSILON:
        return Admission(
            Outcome.BORROWED, "borrowed", f"borrowing {request.gpus:g} idle GPUs beyond queue {queue.path}'s guarantee"
        )
    return Admission(
        Outcome.DENIED,
        "insufficient_gpus",
        f"{max(0.0, idle):g} idle GPUs, {request.gpus:g} needed to borrow beyond queue {queue.path}'s guarantee",
    )


def admission_response(admission: Admission) -> quota_pb2.AdmitResponse:
    return quota_pb2.AdmitResponse(
        admitted=admission.admitted,
        borrowed=admission.outcome is Outcome.BORROWED,
        reason=common_pb2.PendingReason(code=admission.code, resource=admission.resource, message=admission.message),
    )


# --- reclaim ------------------------------------------------------------------------------------------------


def _diverging_queue(config: QuotaConfig, beneficiary: str, victim: str) -> str:
    """The victim's ancestor just below the lowest common ancestor of the two queues."""
    beneficiary_chain = [queue.path for queue in config.ancestors(beneficiary)]
    for queue in config.ancestors(victim):
        if queue.path not in beneficiary_chain:
            return queue.path
    return victim


def _over_quota(config: QuotaConfig, held: Mapping[str, float], path: str) -> float:
    queue = config.queues[path]
    return (held.get(path, 0.0) - queue.guaranteed_gpus) / queue.weight


def choose_victims(
    config: QuotaConfig,
    holdings: Sequence[Holding],
    need_gpus: float,
    beneficiary_queue: str,
    gpu_model: str = ANY_MODEL,
) -> tuple[list[Holding], float]:
    """Borrowed work to preempt so `need_gpus` GPUs return to `beneficiary_queue`, and what stays uncovered.

    `holdings` is every admitted job (so over-quota is measured on real use). One victim at a time: the
    candidate whose diverging queue is most over its guarantee per unit of weight, then whose own queue is,
    then the lowest priority tier, the latest admitted and the job id. Queues at or below their guarantee at
    the diverging level are protected; they are skipped, never a reason to stop.
    """
    held = dict(usage_view(config, [h for h in holdings if not h.reclaiming]).subtree)
    candidates = [
        holding
        for holding in holdings
        if holding.borrowed
        and holding.preemptible
        and not holding.reclaiming
        and holding.queue in config.queues
        and holding.queue != beneficiary_queue
        and (gpu_model == ANY_MODEL or holding.gpu_model in (gpu_model, ANY_MODEL))
    ]
    diverging = {h.queue: _diverging_queue(config, beneficiary_queue, h.queue) for h in candidates}
    victims: list[Holding] = []
    remaining = need_gpus
    while remaining > EPSILON and candidates:
        eligible = [h for h in candidates if _over_quota(config, held, diverging[h.queue]) > EPSILON]
        if not eligible:
            break
        victim = min(
            eligible,
            key=lambda h: (
                -_over_quota(config, held, diverging[h.queue]),
                -_over_quota(config, held, h.queue),
                h.priority_tier,
                -h.seq,
                h.job_id,
            ),
        )
        victims.append(victim)
        candidates.remove(victim)
        remaining -= victim.gpus
        for queue in config.ancestors(victim.queue):
            held[queue.path] = held.get(queue.path, 0.0) - victim.gpus
    return victims, max(0.0, remaining)


def reclaim_decision_id(beneficiary_job: str, beneficiary_generation: int, victim: Holding) -> str:
    """Deterministic, so a republished decision is deduplicated by consumers (ce_id)."""
    return f"reclaim:{beneficiary_job}#{beneficiary_generation}:{victim.job_id}#{victim.generation}"


# --- fair share: hierarchical DRF with decayed usage ------------------------------------------------------------


def decay_factor(elapsed_s: float, half_life_s: float) -> float:
    if half_life_s <= 0:
        raise ValueError("half_life_s must be > 0")
    return float(0.5 ** (max(0.0, elapsed_s) / half_life_s))


def decayed_usage(previous: Resources, elapsed_s: float, half_life_s: float, added: Resources) -> Resources:
    """Usage (resource-seconds) aged by a half-life, plus what was used since."""
    return previous.scaled(decay_factor(elapsed_s, half_life_s)) + added


def usage_factor(usage_share: float, weight_share: float) -> float:
    """Slurm's classic fair-share factor 2^(-usage/shares): a queue that used its share recently counts half."""
    if weight_share <= 0:
        return 0.0
    return float(2.0 ** (-usage_share / weight_share))


def _subtree_sum(config: QuotaConfig, values: Mapping[str, Resources], path: str) -> Resources:
    total = Resources()
    for leaf, value in values.items():
        if leaf in config.queues and config.in_subtree(leaf, path):
            total = total + value
    return total


def fair_shares(
    config: QuotaConfig,
    demand: Mapping[str, Resources],
    usage: Mapping[str, Resources] | None = None,
) -> dict[str, Resources]:
    """Each queue's fair share of the cluster: guarantees first, then idle capacity by weighted DRF.

    `demand` is per leaf (held plus pending); `usage` the decayed usage per leaf. At every level of the tree
    each child first gets its demand up to its guarantee; what is left is filled progressively so that every
    child's dominant share divided by its effective weight rises together, capped by demand. The effective
    weight is the over-quota weight times 2^(-usage share/weight share), so recent heavy users yield.
    """
    usage = usage or {}
    capacity = config.total_capacity
    result: dict[str, Resources] = {}
    _share_level(config, None, capacity, capacity, demand, usage, result)
    return result


def _share_level(
    config: QuotaConfig,
    parent: str | None,
    available: Resources,
    capacity: Resources,
    demand: Mapping[str, Resources],
    usage: Mapping[str, Resources],
    result: dict[str, Resources],
) -> None:
    children = config.children(parent)
    if not children:
        return
    wants = {child.path: _subtree_sum(config, demand, child.path).clipped() for child in children}
    allocation: dict[str, Resources] = {}
    for child in children:
        want = wants[child.path]
        fraction = 1.0 if want.gpus <= child.guaranteed_gpus else child.guaranteed_gpus / want.gpus
        allocation[child.path] = want.scaled(fraction)
    granted = sum((alloc for alloc in allocation.values()), Resources())
    if not granted.fits_in(available):  # guarantees never exceed the parent; shrink only on bad input
        factor = min((a / g for a, g in zip(_dims(available), _dims(granted), strict=True) if g > 0), default=1.0)
        allocation = {path: alloc.scaled(factor) for path, alloc in allocation.items()}
        granted = granted.scaled(factor)
    residual = {path: (wants[path] - allocation[path]).clipped() for path in wants}
    active = [child for child in children if residual[child.path].dominant_share(capacity) > EPSILON]
    if active:
        usages = {child.path: _subtree_sum(config, usage, child.path).dominant_share(capacity) for child in active}
        usage_total = sum(usages.values())
        weight_total = sum(child.weight for child in active)
        effective = {
            child.path: child.weight
            * usage_factor(usages[child.path] / usage_total if usage_total > 0 else 0.0, child.weight / weight_total)
            for child in active
        }
        extra = _progressive_fill(
            {child.path: residual[child.path] for child in active},
            effective,
            (available - granted).clipped(),
            capacity,
        )
        for path, alloc in extra.items():
            allocation[path] = allocation[path] + alloc
    for child in children:
        result[child.path] = allocation[child.path]
        _share_level(config, child.path, allocation[child.path], capacity, demand, usage, result)


def _within(amount: Resources, free: Resources) -> bool:
    """Strictly inside (no tolerance), so fair shares never add up to more than the capacity."""
    return all(a <= f for a, f in zip(_dims(amount), _dims(free), strict=True))


def _dims(resources: Resources) -> tuple[float, float, float]:
    return (resources.gpus, resources.cpu_milli, resources.memory_mib)


def _progressive_fill(
    residual: Mapping[str, Resources], weights: Mapping[str, float], free: Resources, capacity: Resources
) -> dict[str, Resources]:
    """Weighted DRF water-filling: find the largest level t with each child at min(1, t·w/ds) of its demand."""

    def at(level: float) -> dict[str, Resources]:
        return {
            path: want.scaled(min(1.0, level * weights[path] / want.dominant_share(capacity)))
            for path, want in residual.items()
        }

    def total(allocation: Mapping[str, Resources]) -> Resources:
        return sum(allocation.values(), Resources())

    if _within(total(residual), free):
        return dict(residual)
    low, high = 0.0, max(want.dominant_share(capacity) / max(weights[p], EPSILON) for p, want in residual.items())
    for _ in range(80):
        middle = (low + high) / 2
        if _within(total(at(middle)), free):
            low = middle
        else:
            high = middle
    return at(low)


# --- queue state (what quota.state publishes) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueStatus:
    queue: str
    guaranteed_gpus: float
    limit_gpus: float
    used_gpus: float
    borrowed_gpus: float
    lent_gpus: float
    fair_share_gpus: float


def queue_statuses(
    config: QuotaConfig, holdings: Sequence[Holding], fair: Mapping[str, Resources] | None = None
) -> list[QueueStatus]:
    """Guarantee, use, borrowed and lent GPUs per queue.

    Borrowed GPUs come first from capacity nobody is guaranteed, then from unused guarantees of leaves in
    proportion to how much each leaves unused; a parent sums its children.
    """
    view = usage_view(config, holdings)
    leaves = [path for path in config.queues if config.is_leaf(path)]
    unused = {
        path: max(
            0.0, config.queues[path].guaranteed_gpus - (view.subtree.get(path, 0.0) - view.borrowed.get(path, 0.0))
        )
        for path in leaves
    }
    borrowed_total = sum(view.borrowed.values())
    unguaranteed = max(0.0, sum(config.capacity_gpus.values()) - sum(config.queues[p].guaranteed_gpus for p in leaves))
    from_guarantees = max(0.0, borrowed_total - unguaranteed)
    unused_total = sum(unused.values())
    ratio = min(1.0, from_guarantees / unused_total) if unused_total > 0 else 0.0
    lent_leaf = {path: unused[path] * ratio for path in leaves}
    statuses = []
    for path in sorted(config.queues):
        queue = config.queues[path]
        in_subtree = [leaf for leaf in leaves if config.in_subtree(leaf, path)]
        statuses.append(
            QueueStatus(
                queue=path,
                guaranteed_gpus=queue.guaranteed_gpus,
                limit_gpus=queue.limit_gpus or 0.0,
                used_gpus=view.subtree.get(path, 0.0),
                borrowed_gpus=sum(view.borrowed.get(leaf, 0.0) for leaf in in_subtree),
                lent_gpus=sum(lent_leaf[leaf] for leaf in in_subtree),
                fair_share_gpus=(fair or {}).get(path, Resources()).gpus,
            )
        )
    return statuses


# --- the ledger ------------------------------------------------------------------------------------------------


class Effect(Enum):
    OPEN = "open"  # the job's GPUs start counting
    CLOSE = "close"  # they stop
    NONE = "none"


# What a team pays for is what placement allocated to it: the meter opens at BOUND (placement published the
# allocation, whatever integration asked for it). RUNNING opens it only where no BOUND came first (a cluster
# integration that binds outside placement); after a BOUND it changes nothing, so a job is never billed twice.
OPENING_STATES = frozenset({events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING})
CLOSING_STATES = frozenset(
    {
        events_pb2.JOB_STATE_COMPLETED,
        events_pb2.JOB_STATE_FAILED,
        events_pb2.JOB_STATE_PREEMPTED,
        events_pb2.JOB_STATE_RELEASED,
    }
)
# States that end an admission (the quota it held is free again).
RELEASING_STATES = CLOSING_STATES


def lifecycle_effect(state: int) -> Effect:
    """BOUND (or RUNNING, whichever comes first) starts the meter; completed, failed, preempted and released
    stop it. RESUMED is a requeue (the next generation's BOUND starts the meter again): nothing here."""
    if state in OPENING_STATES:
        return Effect.OPEN
    if state in CLOSING_STATES:
        return Effect.CLOSE
    return Effect.NONE


MICROS = 1_000_000


def timestamp_micros(seconds: int, nanos: int) -> int:
    """Ledger time is whole microseconds (Postgres timestamptz resolution), so sums are exact."""
    return seconds * MICROS + nanos // 1000


def gpus_decimal(gpus: float) -> Decimal:
    """GPUs as the shortest decimal that round-trips the double (0.46, not 0.46000000000000002)."""
    return Decimal(repr(gpus))


def gpu_seconds(gpus: Decimal, start_us: int, end_us: int) -> Decimal:
    """Exact GPU-seconds of an interval (no float rounding: the ledger must add up to the second)."""
    return gpus * Decimal(max(0, end_us - start_us)) / MICROS


def overlap_micros(start_us: int, end_us: int, since_us: int, until_us: int) -> int:
    return max(0, min(end_us, until_us) - max(start_us, since_us))


def cost(gpu_secs: Decimal, rate_per_gpu_hour: Decimal) -> Decimal:
    return gpu_secs * rate_per_gpu_hour / 3600


@dataclass(frozen=True, slots=True)
class OpenInterval:
    job_id: str
    generation: int
    queue: str
    gpu_model: str
    priority_tier: int
    gpus: Decimal
    start_us: int


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    job_id: str
    generation: int
    queue: str
    gpu_model: str
    priority_tier: int
    gpus: Decimal
    start_us: int
    end_us: int
    final_state: int

    @property
    def gpu_seconds(self) -> Decimal:
        return gpu_seconds(self.gpus, self.start_us, self.end_us)


@dataclass
class Ledger:
    """The ledger's rules as an in-memory book (the simulator's ledger; the service keeps the same rows in
    Postgres). One metered interval per (job, generation): a repeated RUNNING, a stop without a start or an
    event for an already closed generation changes nothing, so replays never count twice."""

    open: dict[tuple[str, int], OpenInterval] = field(default_factory=dict)
    closed: dict[tuple[str, int], LedgerEntry] = field(default_factory=dict)

    def apply(
        self,
        *,
        job_id: str,
        generation: int,
        state: int,
        at_us: int,
        queue: str = "",
        gpu_model: str = ANY_MODEL,
        priority_tier: int = 0,
        gpus: Decimal = Decimal(0),
    ) -> LedgerEntry | None:
        key = (job_id, generation)
        effect = lifecycle_effect(state)
        if key in self.closed or effect is Effect.NONE:
            return None
        if effect is Effect.OPEN:
            if key not in self.open:
                self.open[key] = OpenInterval(job_id, generation, queue, gpu_model, priority_tier, gpus, at_us)
            return None
        interval = self.open.pop(key, None)
        if interval is None:
            return None
        entry = LedgerEntry(
            job_id,
            generation,
            interval.queue,
            interval.gpu_model,
            interval.priority_tier,
            interval.gpus,
            interval.start_us,
            max(at_us, interval.start_us),
            state,
        )
        self.closed[key] = entry
        return entry

    def total_gpu_seconds(self) -> Decimal:
        return sum((entry.gpu_seconds for entry in self.closed.values()), Decimal(0))


def team_of(queue: str) -> str:
    """organisation/team: the first two levels of a queue path (the report's --by team)."""
    return "/".join(queue.split("/")[:2])


def with_reclaiming(holdings: Sequence[Holding], victims: Iterable[Holding]) -> list[Holding]:
    chosen = {(victim.job_id, victim.generation) for victim in victims}
    return [replace(h, reclaiming=True) if (h.job_id, h.generation) in chosen else h for h in holdings]
