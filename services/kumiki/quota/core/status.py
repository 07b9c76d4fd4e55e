"""Queue state (what quota.state publishes): guarantee, use, borrowed and lent GPUs and fair share per
queue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kumiki.quota.core.admission import Holding, usage_view
from kumiki.quota.core.resources import Resources
from kumiki.quota.core.tree import QuotaConfig


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
