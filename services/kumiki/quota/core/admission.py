"""Admission: inside the guarantee a job is admitted even when borrowers hold the GPUs (the shortfall is
reclaimed from them); beyond it only preemptible work is admitted, as borrowed, onto idle GPUs; a hard limit
caps a whole subtree, borrowed work included."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from kumiki.quota.core.resources import ANY_MODEL, EPSILON
from kumiki.quota.core.tree import Queue, QuotaConfig


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
    running: bool = True  # bound (an open interval): preempting it frees GPUs now; an unbound one frees none yet


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
