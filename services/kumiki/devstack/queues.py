"""The local stack's queue tree: what `kumiki up` loads when Postgres has none, so the README's first commands
(`kumiki placement bind demo-1 --queue research ...`) are admitted by the real quota service at once."""

from __future__ import annotations

from kumiki.common.config import DatabaseSettings
from kumiki.quota.adapters.store import replace_tree
from kumiki.quota.core import ANY_MODEL, Queue, QuotaConfig, build_config


def development_tree(capacity_gpus: int) -> QuotaConfig:
    """research (half the cluster), product (a quarter) and batch (borrowed capacity only), any GPU model."""
    if capacity_gpus < 1:
        raise ValueError(f"capacity_gpus must be >= 1, got {capacity_gpus}")
    queues = [
        Queue("research", None, {ANY_MODEL: float(capacity_gpus // 2)}, weight=2.0),
        Queue("product", None, {ANY_MODEL: float(capacity_gpus // 4)}),
        Queue("batch", None, {ANY_MODEL: 0.0}, weight=0.5),
    ]
    return build_config(queues, {ANY_MODEL: float(capacity_gpus)})


async def ensure_tree(database: DatabaseSettings, capacity_gpus: int) -> bool:
    """Load the development tree unless a tree is loaded already; True when it loaded one."""
    previous, _ = await replace_tree(database, None, "kumiki up")
    if previous is not None:
        return False
    await replace_tree(database, development_tree(capacity_gpus), "kumiki up (development tree)")
    return True
