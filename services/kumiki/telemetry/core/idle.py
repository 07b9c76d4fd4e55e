"""Folding a chunk of readings into a node record: latest values, health, idle tracking per GPU (and the
findings gpu.idle carries, once per episode) and each job's GPU-seconds for the usage windows."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kumiki.telemetry.core.chunks import FATAL_XIDS, GpuChunk, NodeChunk
from kumiki.telemetry.core.config import TelemetryConfig
from kumiki.telemetry.core.json_types import Json
from kumiki.telemetry.core.records import GpuLive, Holding, NodeRecord, evolve
from kumiki.telemetry.core.windows import WindowAggregate


@dataclass(frozen=True, slots=True)
class IdleFinding:
    """A job's GPUs on one node stayed below its queue's threshold for the configured time (gpu.idle)."""

    job_id: str
    generation: int
    queue: str
    node: str
    gpu_uuids: tuple[str, ...]
    mean_utilization_pct: float
    since: float
    until: float

    @property
    def idle_gpu_seconds(self) -> float:
        return (self.until - self.since) * len(self.gpu_uuids)

    @property
    def event_id(self) -> str:
        """Stable per episode, so a redelivered chunk republishes the same ce_id and consumers dedupe it."""
        return f"gpu-idle/{self.job_id}/{self.generation}/{self.node}/{self.since:.3f}"


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
) -> tuple[NodeRecord, list[IdleFinding], list[Usage]]:
    """Fold one chunk into the node: latest values, health, idle tracking per GPU, and usage per job.

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
    record, findings = _idle_findings(record, config) if record.holdings else (record, [])
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
        findings.append(
            IdleFinding(
                job_id,
                holding.generation,
                holding.queue,
                record.node,
                tuple(uuid for uuid, _ in present),
                mean,
                since,
                until,
            )
        )
        changed[job_id] = replace(holding, reported_since=since)
    if not changed:
        return record, findings
    return evolve(record, holdings={**record.holdings, **changed}), findings
