"""The node record, what the node table keeps per node: its inventory, each GPU's latest state, the jobs
holding GPUs, staleness and what was last published. Every input is folded in by a function here or in
`idle` (readings), returning a new record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from kumiki.telemetry.core.allocations import AllocationChange
from kumiki.telemetry.core.json_types import Json


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    index: int
    uuid: str
    model: str
    memory_mib: int
    nvlink_island: int
    mig_enabled: bool
    mig_slices: tuple[str, ...]
    shareable: bool = False


@dataclass(frozen=True, slots=True)
class Inventory:
    """The agent's static view of a node (from kumiki.node.inventory)."""

    node: str
    gpus: tuple[InventoryGpu, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    rack: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> Json:
        """The node-input item (with its kind)."""
        return {"kind": "inventory", **self.fields_json()}

    def fields_json(self) -> Json:
        """The fields only: inside a node record, where it equals orjson's own rendering of the dataclass."""
        return {
            "node": self.node,
            "cpu_milli": self.cpu_milli,
            "memory_mib": self.memory_mib,
            "rack": self.rack,
            "labels": dict(self.labels),
            "gpus": [{**{k: getattr(g, k) for k in g.__slots__}, "mig_slices": list(g.mig_slices)} for g in self.gpus],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Inventory:
        gpus = tuple(InventoryGpu(**{**g, "mig_slices": tuple(g["mig_slices"])}) for g in data["gpus"])
        return cls(
            data["node"], gpus, int(data["cpu_milli"]), int(data["memory_mib"]), data["rack"], dict(data["labels"])
        )


class GpuLive(NamedTuple):
    """Latest state of one whole GPU from its samples. A tuple: built for every GPU of every chunk, and
    stored in the changelog as a JSON array (the cheap node record)."""

    gpu_index: int  # not `index`: that is tuple.index
    model: str
    last_ts: float
    utilization_pct: float | None
    memory_total_mib: int | None
    healthy: bool
    # Idle tracking: below the job's threshold continuously since `idle_since` (None: not below now).
    idle_since: float | None = None
    idle_util_sum: float = 0.0
    idle_util_n: int = 0


@dataclass(frozen=True, slots=True)
class Holding:
    job_id: str
    generation: int
    queue: str
    gpu_indices: tuple[int, ...]
    reported_since: float | None = None  # the idle episode already published (once per episode)
    # Busy tracking (gpu.busy): published once computing is seen, and again after each idle episode. Until then the
    # job's GPU-seconds held and used are summed over stretches as long as its idle rule. The sums change with every
    # chunk and mean nothing to placement, so they are left out of equality: `may_need_publication` compares
    # holdings to decide whether to build the node's view.
    busy_reported: bool = False
    stretch_held_s: float = field(default=0.0, compare=False)
    stretch_used_s: float = field(default=0.0, compare=False)

    def with_stretch(self, held_s: float, used_s: float, busy_reported: bool | None = None) -> Holding:
        """This holding with its stretch's sums (and busy flag) replaced. Positional: a fold calls it for every
        held job not yet busy, and `dataclasses.replace` cost a quarter of such a fold."""
        reported = self.busy_reported if busy_reported is None else busy_reported
        return Holding(
            self.job_id, self.generation, self.queue, self.gpu_indices, self.reported_since, reported, held_s, used_s
        )


@dataclass(frozen=True)
class NodeRecord:
    node: str
    inventory: Inventory | None = None
    gpus: Mapping[str, GpuLive] = field(default_factory=dict)  # by GPU UUID, whole GPUs only
    holdings: Mapping[str, Holding] = field(default_factory=dict)  # by job id
    last_seen: float = 0.0
    stale: bool = False
    version: int = 0
    published_digest: str = ""
    published_at: float = 0.0

    def to_json(self) -> Json:
        return {
            "node": self.node,
            "inventory": self.inventory.fields_json() if self.inventory else None,
            "gpus": {k: list(g) for k, g in self.gpus.items()},
            "holdings": {
                k: {**{f: getattr(h, f) for f in h.__slots__}, "gpu_indices": list(h.gpu_indices)}
                for k, h in self.holdings.items()
            },
            "last_seen": self.last_seen,
            "stale": self.stale,
            "version": self.version,
            "published_digest": self.published_digest,
            "published_at": self.published_at,
        }

    def __json__(self) -> Json:
        """faust's JSON codec calls this when it uses the standard json module: the table holds the object,
        the changelog its JSON. With orjson installed, faust's codec renders the dataclass itself (in C,
        without this call); `to_json` is written to be the same JSON, and a test holds them equal."""
        return self.to_json()

    @classmethod
    def stored(cls, value: NodeRecord | Mapping[str, Any] | None) -> NodeRecord | None:
        """A table value as a record: the object this worker wrote, or the JSON a changelog restored."""
        if value is None or isinstance(value, NodeRecord):
            return value
        return cls.from_json(value)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeRecord:
        return cls(
            node=data["node"],
            inventory=Inventory.from_json(data["inventory"]) if data["inventory"] else None,
            gpus={k: _gpu_live(g) for k, g in data["gpus"].items()},
            holdings={k: Holding(**{**h, "gpu_indices": tuple(h["gpu_indices"])}) for k, h in data["holdings"].items()},
            last_seen=float(data["last_seen"]),
            stale=bool(data["stale"]),
            version=int(data["version"]),
            published_digest=data["published_digest"],
            published_at=float(data["published_at"]),
        )


def _gpu_live(data: Mapping[str, Any] | Sequence[Any]) -> GpuLive:
    """The array form, or the object form written before GpuLive became a tuple (its `index` key)."""
    if isinstance(data, Mapping):
        fields = dict(data)
        fields["gpu_index"] = fields.pop("index", fields.get("gpu_index"))
        return GpuLive(**fields)
    return GpuLive(*data)


def evolve(record: NodeRecord, **changes: Any) -> NodeRecord:
    """`dataclasses.replace` without its per-call field introspection (NodeRecord has no __post_init__):
    folding a live chunk replaces the record two or three times."""
    new = object.__new__(NodeRecord)
    new.__dict__.update(record.__dict__)
    new.__dict__.update(changes)
    return new


def apply_inventory(record: NodeRecord | None, inventory: Inventory) -> NodeRecord:
    return replace(record or NodeRecord(inventory.node), inventory=inventory)


def apply_allocation(record: NodeRecord | None, change: AllocationChange) -> NodeRecord:
    """Hold or release; an older generation of the job never overrides a newer one on this node."""
    record = record or NodeRecord(change.node)
    holdings = dict(record.holdings)
    current = holdings.get(change.job_id)
    if current is not None and change.generation < current.generation:
        return record
    same = current is not None and current.generation == change.generation
    if change.holding:
        holdings[change.job_id] = (
            replace(current, queue=change.queue, gpu_indices=change.gpu_indices)
            if same and current
            else Holding(change.job_id, change.generation, change.queue, change.gpu_indices)
        )
    else:
        holdings.pop(change.job_id, None)
    # a new holder's idle time starts with its hold: what the GPUs idled before (free, or a previous attempt's
    # zombie) is not its own, else a requeued zombie is reported idle the moment it is bound again
    fresh = set(change.gpu_indices) if change.holding and not same else set()
    if current is not None and not (same and change.holding):
        fresh |= set(current.gpu_indices)
    gpus = record.gpus
    if fresh and any(gpu.gpu_index in fresh and gpu.idle_since is not None for gpu in gpus.values()):
        gpus = {
            uuid: gpu._replace(idle_since=None, idle_util_sum=0.0, idle_util_n=0) if gpu.gpu_index in fresh else gpu
            for uuid, gpu in gpus.items()
        }
    return replace(record, holdings=holdings, gpus=gpus)


def check_stale(record: NodeRecord, now: float, timeout_s: float) -> NodeRecord:
    """A node that has not reported for `timeout_s` is stale (unhealthy) until its next sample."""
    stale = record.last_seen > 0 and now - record.last_seen > timeout_s
    return record if stale == record.stale else evolve(record, stale=stale)
