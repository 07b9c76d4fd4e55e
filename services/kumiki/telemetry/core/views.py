"""What cluster.state carries: a node record as placement sees it, and when it is published (at once for a
change placement acts on, else at most once per interval)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kumiki.telemetry.core.records import NodeRecord, evolve


@dataclass(frozen=True, slots=True)
class GpuView:
    index: int
    uuid: str
    model: str
    memory_mib: int
    nvlink_island: int
    mig_enabled: bool
    mig_slices: tuple[str, ...]
    healthy: bool
    utilization_pct: float
    shareable: bool
    allocated_to: str  # job id, "" when free


@dataclass(frozen=True, slots=True)
class NodeView:
    node: str
    rack: str
    gpus: tuple[GpuView, ...]
    cpu_milli: int
    memory_mib: int
    healthy: bool
    last_seen: float
    labels: Mapping[str, str]

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(gpu.index for gpu in self.gpus if not gpu.allocated_to and gpu.healthy)

    def placement_digest(self) -> str:
        """What placement acts on (not utilisation): a change here is published at once."""
        parts = [
            self.node,
            str(self.healthy),
            self.rack,
            str(self.cpu_milli),
            str(self.memory_mib),
            ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())),
        ]
        parts += [
            f"{g.index}:{g.uuid}:{g.memory_mib}:{g.nvlink_island}:{g.mig_enabled}:{'+'.join(g.mig_slices)}"
            f":{g.healthy}:{g.allocated_to}"
            for g in self.gpus
        ]
        return "|".join(parts)


FREE_GPUS_LABEL = "kumiki.dev/free-gpus"


def node_view(record: NodeRecord) -> NodeView:
    """The inventory's GPUs (or, without one, the GPUs seen in samples) with live health and holders."""
    holder = {index: h.job_id for h in record.holdings.values() for index in h.gpu_indices}
    live_by_index = {gpu.gpu_index: (uuid, gpu) for uuid, gpu in record.gpus.items()}
    gpus: list[GpuView] = []
    if record.inventory is not None:
        for inv in record.inventory.gpus:
            live = record.gpus.get(inv.uuid)
            gpus.append(
                GpuView(
                    inv.index,
                    inv.uuid,
                    inv.model,
                    inv.memory_mib,
                    inv.nvlink_island,
                    inv.mig_enabled,
                    inv.mig_slices,
                    live.healthy if live else True,
                    (live.utilization_pct or 0.0) if live else 0.0,
                    inv.shareable,
                    holder.get(inv.index, ""),
                )
            )
    else:
        for index, (uuid, live) in sorted(live_by_index.items()):
            gpus.append(
                GpuView(
                    index,
                    uuid,
                    live.model,
                    live.memory_total_mib or 0,
                    index,
                    False,
                    (),
                    live.healthy,
                    live.utilization_pct or 0.0,
                    False,
                    holder.get(index, ""),
                )
            )
    inventory = record.inventory
    labels = dict(inventory.labels) if inventory else {}
    view = NodeView(
        record.node,
        inventory.rack if inventory else "",
        tuple(gpus),
        inventory.cpu_milli if inventory else 0,
        inventory.memory_mib if inventory else 0,
        not record.stale and record.last_seen > 0,
        record.last_seen,
        labels,
    )
    labels[FREE_GPUS_LABEL] = ",".join(str(i) for i in view.free_gpus)
    return view


def publish_decision(record: NodeRecord, view: NodeView, now: float, interval_s: float) -> NodeRecord | None:
    """The record to store if `view` should be published now (placement-relevant change, or utilisation
    older than `interval_s`), else None."""
    digest = view.placement_digest()
    if digest == record.published_digest and now - record.published_at < interval_s:
        return None
    return evolve(record, published_digest=digest, published_at=now, version=record.version + 1)


def may_need_publication(before: NodeRecord | None, after: NodeRecord, now: float, interval_s: float) -> bool:
    """Whether `node_view` and `publish_decision` must run for `after`: False only when nothing the placement
    digest covers can differ from `before` (whose digest was already decided) and the utilisation interval
    has not elapsed. Building the view costs more than folding a live chunk, so this is checked first."""
    if before is None or now - after.published_at >= interval_s or before.published_digest == "":
        return True
    if (
        before.inventory != after.inventory
        or before.holdings != after.holdings
        or before.stale != after.stale
        or (before.last_seen > 0) != (after.last_seen > 0)
        or before.gpus.keys() != after.gpus.keys()
    ):
        return True
    old = before.gpus
    return any(
        gpu.healthy != old[uuid].healthy
        or gpu.gpu_index != old[uuid].gpu_index
        or (after.inventory is None and gpu.memory_total_mib != old[uuid].memory_total_mib)
        for uuid, gpu in after.gpus.items()
    )


def allocated_vs_used(view: NodeView) -> tuple[int, float]:
    """Allocated GPUs and the GPU-equivalents they actually use (Σ utilisation / 100)."""
    held = [gpu for gpu in view.gpus if gpu.allocated_to]
    return len(held), sum(gpu.utilization_pct for gpu in held) / 100.0


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
