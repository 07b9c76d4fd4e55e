"""Fair share: hierarchical weighted DRF over guarantees and idle capacity, with usage decayed by a
half-life so recent heavy users yield."""

from __future__ import annotations

from collections.abc import Mapping

from kumiki.quota.core.resources import EPSILON, Resources
from kumiki.quota.core.tree import QuotaConfig


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
