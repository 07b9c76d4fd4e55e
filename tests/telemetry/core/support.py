"""Helpers shared by the telemetry core's tests: a config with short idle rules, readings, inventories,
holds, and feeding readings through `summarise` and `apply_chunk` as stage 1 and 2 do (`fold`; `feed` keeps the
idle findings, `feed_busy` the busy ones)."""

from __future__ import annotations

from kumiki.telemetry import core
from kumiki.telemetry.core import IdleRule, Inventory, InventoryGpu, NodeRecord, Reading, TelemetryConfig

CONFIG = TelemetryConfig(
    gpu_window_s=60,
    usage_window_s=300,
    usage_step_s=60,
    node_timeout_s=30,
    publish_interval_s=10,
    idle_default=IdleRule(5.0, 60.0),
    idle_by_queue={"lenient": IdleRule(50.0, 60.0)},
)


def reading(
    node: str,
    index: int,
    t: float,
    util: float | None,
    *,
    ecc: int | None = None,
    xids: tuple[int, ...] = (),
    mig: int | None = None,
) -> Reading:
    return Reading(node, f"GPU-{node}-{index}", index, mig, t, util, 1000, 80000, ecc, xids, "A100")


def inventory(node: str, gpus: int) -> Inventory:
    return Inventory(
        node, tuple(InventoryGpu(i, f"GPU-{node}-{i}", "A100", 81920, i // 4, False, ()) for i in range(gpus))
    )


def hold(
    record: NodeRecord | None, node: str, job: str, indices: tuple[int, ...], queue: str = "q", generation: int = 1
) -> NodeRecord:
    return core.apply_allocation(record, core.AllocationChange(node, job, generation, queue, indices, True))


def fold(record: NodeRecord, samples: list[Reading]) -> tuple[NodeRecord, list[core.GpuFinding], list[core.Usage]]:
    """The samples through stage 1 and 2: the record, every finding (idle and busy) and the usage."""
    findings: list[core.GpuFinding] = []
    usages: list[core.Usage] = []
    for chunk in core.summarise(samples, CONFIG.bucket_s):
        record, found, used = core.apply_chunk(record, chunk, CONFIG)
        findings += found
        usages += used
    return record, findings, usages


def feed(record: NodeRecord, samples: list[Reading]) -> tuple[NodeRecord, list[core.IdleFinding], list[core.Usage]]:
    """As `fold`, with the idle findings only (gpu.idle)."""
    record, findings, usages = fold(record, samples)
    return record, [finding for finding in findings if isinstance(finding, core.IdleFinding)], usages


def feed_busy(record: NodeRecord, samples: list[Reading]) -> tuple[NodeRecord, list[core.BusyFinding]]:
    """As `fold`, with the busy findings only (gpu.busy)."""
    record, findings, _ = fold(record, samples)
    return record, [finding for finding in findings if isinstance(finding, core.BusyFinding)]
