"""Reclaim victims: borrowed work only, from the most over-quota queue first, judged where the beneficiary's
and the victim's paths diverge. A queue within its guarantee there is protected and never a reason to stop
looking elsewhere (kai-scheduler/KAI-Scheduler#1750)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from kumiki.quota.core.admission import Holding, usage_view
from kumiki.quota.core.resources import ANY_MODEL, EPSILON
from kumiki.quota.core.tree import QuotaConfig


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
    candidate whose diverging queue is most over its guarantee per unit of weight, then a running one before
    one admitted but not bound yet, then whose own queue is most over, then the lowest priority tier, the
    latest admitted and the job id. Queues at or below their guarantee at the diverging level are protected;
    they are skipped, never a reason to stop.

    Running first because only a running victim gives GPUs back now: an unbound one holds quota but no GPU,
    and its reclaim waits for its bind (the coordinator holds the decision until then, and drops it if the bind
    never comes), so choosing it leaves the beneficiary waiting on GPUs nobody frees.
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
                not h.running,
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


def with_reclaiming(holdings: Sequence[Holding], victims: Iterable[Holding]) -> list[Holding]:
    chosen = {(victim.job_id, victim.generation) for victim in victims}
    return [replace(h, reclaiming=True) if (h.job_id, h.generation) in chosen else h for h in holdings]
