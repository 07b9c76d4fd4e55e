"""The queue tree: the validated queue file (queues, capacity, rates) and the invariants a tree must keep
(parents exist, guarantees nest inside the parent's, limits hold guarantees)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from kumiki.quota.core.resources import ANY_MODEL, EPSILON, Resources


class QueueConfigError(ValueError):
    """A queue file that cannot be applied; the message names the queue (or section) and the field."""

    def __init__(self, where: str, field_name: str, problem: str) -> None:
        super().__init__(f"{where}: {field_name}: {problem}")
        self.where = where
        self.field = field_name


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
