"""Folding a chunk of readings into a node record: latest values, health, idle tracking per GPU (and the
findings gpu.idle carries, once per episode), busy tracking per holding (gpu.busy) and each job's GPU-seconds
for the usage windows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Self

from kumiki.telemetry.core.chunks import FATAL_XIDS, GpuChunk, NodeChunk
from kumiki.telemetry.core.config import TelemetryConfig
from kumiki.telemetry.core.json_types import Json
from kumiki.telemetry.core.records import GpuLive, Holding, NodeRecord, evolve
from kumiki.telemetry.core.windows import WindowAggregate


@dataclass(frozen=True, slots=True)
class GpuFinding:
    """What telemetry found of a job's GPUs on one node over a stretch of time."""

    job_id: str
    generation: int
    queue: str
    node: str
    gpu_uuids: tuple[str, ...]
    mean_utilization_pct: float
    since: float
    until: float

    KIND: ClassVar[str] = ""  # the event id's head: one per topic

    @classmethod
    def of(
        cls, holding: Holding, node: str, gpu_uuids: Sequence[str], mean_pct: float, since: float, until: float
    ) -> Self:
        return cls(holding.job_id, holding.generation, holding.queue, node, tuple(gpu_uuids), mean_pct, since, until)

    @property
    def event_id(self) -> str:
        """Stable per finding, so a redelivered chunk republishes the same ce_id and consumers dedupe it."""
        return f"{self.KIND}/{self.job_id}/{self.generation}/{self.node}/{self.since:.3f}"


@dataclass(frozen=True, slots=True)
class IdleFinding(GpuFinding):
    """A job's GPUs on one node stayed below its queue's threshold for the configured time (gpu.idle)."""

    KIND: ClassVar[str] = "gpu-idle"

    @property
    def idle_gpu_seconds(self) -> float:
        return (self.until - self.since) * len(self.gpu_uuids)


@dataclass(frozen=True, slots=True)
class BusyFinding(GpuFinding):
    """A job's GPUs on one node computed: their mean utilisation over a stretch as long as its queue's idle rule
    was at or above the rule's threshold (gpu.busy). Once per holding, and again after each idle episode: what
    tells placement that a job found idle, or evicted as idle, computes again."""

    KIND: ClassVar[str] = "gpu-busy"


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-seconds of one job on one node in one chunk: feeds the per-job and per-queue windows."""

    job_id: str
    queue: str
    bucket: float
    aggregate: WindowAggregate

    def to_json(self) -> Json:
        return {
            "job_id": self.job_id,
            "queue": self.queue,
            "bucket": self.bucket,
            "aggregate": self.aggregate.to_json(),
        }


def _gpu_healthy(gpu: GpuChunk) -> bool:
    return not (gpu.ecc_uncorrected or any(xid in FATAL_XIDS for xid in gpu.xids))


def apply_chunk(
    record: NodeRecord | None, chunk: NodeChunk, config: TelemetryConfig
) -> tuple[NodeRecord, list[GpuFinding], list[Usage]]:
    """Fold one chunk into the node: latest values, health, idle tracking per GPU, busy tracking per holding,
    and usage per job. The findings are idle ones (gpu.idle) and busy ones (gpu.busy).

    A GPU's time between its previous sample and the newest one in the chunk (at most node_timeout_s)
    is what it was allocated, used (utilisation share) and idle (below threshold) for.
    """
    record = record or NodeRecord(chunk.node)
    holder_of: dict[int, Holding] = {}
    for held in record.holdings.values():
        for index in held.gpu_indices:
            holder_of[index] = held
    gpus = dict(record.gpus)
    usage: dict[str, list[float]] = {}  # job → the WindowAggregate fields, summed
    last_seen = record.last_seen
    timeout_s = config.node_timeout_s
    for uuid, gpu in chunk.gpus.items():
        last_seen = max(last_seen, gpu.last_ts)
        if gpu.mig is not None:
            continue  # MIG instances have no utilisation in NVML; the board's sample carries health
        previous = gpus.get(uuid)
        if previous is not None and gpu.last_ts <= previous.last_ts:
            continue  # redelivered or out of order: already counted
        holding = holder_of.get(gpu.index)
        threshold = (config.rule_for(holding.queue) if holding else config.idle_default).threshold_pct
        below = gpu.util_n > 0 and gpu.util_max < threshold
        was_since = previous.idle_since if previous is not None else None
        if below and holding is not None:
            if was_since is not None and previous is not None:
                since, util_sum, util_n = (
                    was_since,
                    previous.idle_util_sum + gpu.util_sum,
                    previous.idle_util_n + gpu.util_n,
                )
            else:
                since, util_sum, util_n = gpu.first_ts, gpu.util_sum, gpu.util_n
        else:
            since, util_sum, util_n = None, 0.0, 0
        healthy = (previous.healthy if previous is not None else True) and _gpu_healthy(gpu)
        gpus[uuid] = GpuLive(
            gpu.index, gpu.model, gpu.last_ts, gpu.last_util, gpu.memory_total_mib, healthy, since, util_sum, util_n
        )
        if holding is not None and previous is not None:
            seconds = min(gpu.last_ts - previous.last_ts, timeout_s)
            mean = gpu.util_sum / gpu.util_n if gpu.util_n else 0.0
            sums = usage.get(holding.job_id)
            if sums is None:
                usage[holding.job_id] = [
                    gpu.samples,
                    gpu.util_n,
                    gpu.util_sum,
                    gpu.util_max,
                    seconds,
                    seconds * mean / 100.0,
                    seconds if below else 0.0,
                ]
            else:
                sums[0] += gpu.samples
                sums[1] += gpu.util_n
                sums[2] += gpu.util_sum
                sums[3] = max(sums[3], gpu.util_max)
                sums[4] += seconds
                sums[5] += seconds * mean / 100.0
                sums[6] += seconds if below else 0.0
    record = evolve(record, gpus=gpus, last_seen=last_seen, stale=False)
    findings: list[GpuFinding] = []
    if record.holdings:
        record, idle = _idle_findings(record, config)
        # a job found idle in this chunk: its stretch ended with the episode, and the next starts after this chunk
        record, busy = _busy_findings(record, usage, {finding.job_id for finding in idle}, config)
        findings = [*idle, *busy]
    usages = [
        Usage(
            job_id, record.holdings[job_id].queue, chunk.bucket, WindowAggregate(int(sums[0]), int(sums[1]), *sums[2:])
        )
        for job_id, sums in sorted(usage.items())
    ]
    return record, findings, usages


def _idle_findings(record: NodeRecord, config: TelemetryConfig) -> tuple[NodeRecord, list[IdleFinding]]:
    by_index = {gpu.gpu_index: (uuid, gpu) for uuid, gpu in record.gpus.items()}
    changed: dict[str, Holding] = {}
    findings: list[IdleFinding] = []
    for job_id, holding in record.holdings.items():
        members = [by_index.get(index) for index in holding.gpu_indices]
        if not members or any(m is None or m[1].idle_since is None for m in members):
            if holding.reported_since is not None and any(m is not None and m[1].idle_since is None for m in members):
                changed[job_id] = replace(holding, reported_since=None)  # busy again: a new episode may follow
            continue
        present = [m for m in members if m is not None]
        since = max(gpu.idle_since for _, gpu in present if gpu.idle_since is not None)
        until = min(gpu.last_ts for _, gpu in present)
        if until - since < config.rule_for(holding.queue).duration_s or holding.reported_since is not None:
            continue
        util_n = sum(gpu.idle_util_n for _, gpu in present)
        mean = sum(gpu.idle_util_sum for _, gpu in present) / util_n if util_n else 0.0
        findings.append(IdleFinding.of(holding, record.node, [uuid for uuid, _ in present], mean, since, until))
        # an idle episode ends what computing was seen: the next busy stretch is news again
        changed[job_id] = replace(
            holding, reported_since=since, busy_reported=False, stretch_held_s=0.0, stretch_used_s=0.0
        )
    return _with_holdings(record, changed), findings


def _busy_findings(
    record: NodeRecord, usage: dict[str, list[float]], found_idle: set[str], config: TelemetryConfig
) -> tuple[NodeRecord, list[BusyFinding]]:
    """Per holding not yet reported busy, sum what this chunk held and used into the current stretch; a stretch as
    long as the idle rule (per GPU) ends there: busy when its mean utilisation reached the rule's threshold, else
    it starts over. A mean, not every sample: a job that computes in bursts is busy, a zombie's flickers are not."""
    changed: dict[str, Holding] = {}
    findings: list[BusyFinding] = []
    for job_id, sums in usage.items():
        holding = record.holdings.get(job_id)
        if holding is None or holding.busy_reported or not holding.gpu_indices or job_id in found_idle:
            continue
        held_s = holding.stretch_held_s + sums[4]
        used_s = holding.stretch_used_s + sums[5]
        stretch_s = held_s / len(holding.gpu_indices)
        rule = config.rule_for(holding.queue)
        if stretch_s < rule.duration_s:
            changed[job_id] = holding.with_stretch(held_s, used_s)
            continue
        mean = 100.0 * used_s / held_s if held_s > 0 else 0.0
        changed[job_id] = holding.with_stretch(0.0, 0.0, busy_reported=mean >= rule.threshold_pct)
        if mean < rule.threshold_pct:
            continue
        present = [(uuid, gpu) for uuid, gpu in record.gpus.items() if gpu.gpu_index in holding.gpu_indices]
        until = max(gpu.last_ts for _, gpu in present)
        findings.append(
            BusyFinding.of(holding, record.node, [uuid for uuid, _ in present], mean, until - stretch_s, until)
        )
    return _with_holdings(record, changed), findings


def _with_holdings(record: NodeRecord, changed: dict[str, Holding]) -> NodeRecord:
    return evolve(record, holdings={**record.holdings, **changed}) if changed else record
