"""What quota may lend: the queue file's capacity per GPU model, shrunk to the GPUs the cluster has now.

The queue file says what the organisation runs (and what the guarantees are carved from); `cluster.state` says
what is up. A failed node, an unhealthy GPU or a node gone must stop being lent to borrowers, or quota admits
borrowed work onto GPUs nobody can place it on while it thinks GPUs are idle. Live capacity only ever lowers
the file's (a node the file does not count is not quota's to lend), and applies once any node has been seen:
before that (quota started before the node reporters, or a setup without them) the file stands alone.
Guarantees do not shrink: work inside a guarantee is still admitted, and reclaim covers what it can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kumiki.quota.core.resources import ANY_MODEL
from kumiki.quota.core.tree import QuotaConfig


def effective_capacity(configured: Mapping[str, float], live: Mapping[str, float] | None) -> dict[str, float]:
    """Per configured model the lower of the file's GPUs and the live ones (ANY_MODEL against the live total);
    the file alone while `live` is None (no node seen). The sum never exceeds the live total either: a model
    the file counts twice (by name and as any model) cannot lend the same GPU twice."""
    if live is None:
        return dict(configured)
    effective = {model: min(gpus, live.get(model, 0.0)) for model, gpus in configured.items()}
    over = sum(effective.values()) - live.get(ANY_MODEL, 0.0)
    if over > 0 and ANY_MODEL in effective:  # the any-model capacity gives way first: it is what is left over
        cut = min(over, effective[ANY_MODEL])
        effective[ANY_MODEL] -= cut
    return effective


def with_live_capacity(config: QuotaConfig, live: Mapping[str, float] | None) -> QuotaConfig:
    """The configuration with its capacity shrunk to what the cluster has now (unchanged while `live` is None)."""
    if live is None:
        return config
    effective = effective_capacity(config.capacity_gpus, live)
    return config if effective == dict(config.capacity_gpus) else replace(config, capacity_gpus=effective)
