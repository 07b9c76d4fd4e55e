"""Telemetry ingest's pure core: per-node chunks of readings, node state, job ↔ GPU allocations, idle
detection and usage roll-ups. The faust agents in `adapters/` only move these values between topics and
tables; every decision is here, deterministic and clock-free (time comes in as arguments).

Data flow (see docs/telemetry.md):
  samples  --summarise-->  NodeChunk (per node and time bucket)  --apply_chunk-->  NodeRecord
  job.lifecycle  --allocation_changes-->  AllocationChange (per node)  --apply_allocation-->  NodeRecord
  NodeRecord  --node_view-->  NodeView (what cluster.state carries)  and IdleFinding (gpu.idle)
Everything a table stores has `to_json`/`from_json`, so faust's changelog can restore it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from kumiki.common.config import ConfigError, Environ, env_float, env_int, env_str

# Job states as numbers (kumiki.v1.JobState), so the core needs no generated code.
STATE_BOUND = 3
STATE_RUNNING = 4
STATE_PREEMPTED = 6
STATE_COMPLETED = 8
STATE_FAILED = 9
STATE_RELEASED = 10
HOLDING_STATES = frozenset({STATE_BOUND, STATE_RUNNING})
ENDING_STATES = frozenset({STATE_PREEMPTED, STATE_COMPLETED, STATE_FAILED, STATE_RELEASED})

Json = dict[str, Any]


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class IdleRule:
    """A job's GPUs are idle when every sample stays below `threshold_pct` for `duration_s`."""

    threshold_pct: float
    duration_s: float


@dataclass(frozen=True)
class TelemetryConfig:
    gpu_window_s: float = 60.0  # tumbling, per GPU and per node
    usage_window_s: float = 300.0  # hopping, per job and per queue ...
    usage_step_s: float = 60.0  # ... advancing by this step
    window_expires_s: float = 3600.0
    node_timeout_s: float = 30.0  # a node silent this long is unhealthy
    publish_interval_s: float = 10.0  # cluster.state at most this often per node unless placement-relevant
    session_timeout_s: float = 30.0  # how long the group waits for a crashed worker before rebalancing
    # Stage 1 fills a batch for this long (or up to batch_max records). Stage 2's cost is per node chunk, and
    # a chunk holds one node's samples of one batch: a longer window (or a backlog) makes chunks bigger.
    batch_window_s: float = 0.25
    batch_max: int = 50000
    idle_default: IdleRule = IdleRule(5.0, 600.0)
    idle_by_queue: Mapping[str, IdleRule] = field(default_factory=dict)

    def rule_for(self, queue: str) -> IdleRule:
        return self.idle_by_queue.get(queue, self.idle_default)

    @property
    def bucket_s(self) -> float:
        """Chunks never straddle a window edge: the bucket divides every window size and step."""
        return float(math.gcd(int(self.gpu_window_s), int(self.usage_window_s), int(self.usage_step_s)))

    @classmethod
    def from_env(cls, env: Environ) -> TelemetryConfig:
        def seconds(name: str, default: float) -> float:
            value = env_float(env, name, default, minimum=1, maximum=7 * 86400)
            if value != int(value):
                raise ConfigError(f"{name}: expected a whole number of seconds, got {value:g}")
            return value

        gpu_window = seconds("KUMIKI_TELEMETRY_GPU_WINDOW_S", cls.gpu_window_s)
        usage_window = seconds("KUMIKI_TELEMETRY_USAGE_WINDOW_S", cls.usage_window_s)
        usage_step = seconds("KUMIKI_TELEMETRY_USAGE_STEP_S", cls.usage_step_s)
        if usage_step > usage_window:
            raise ConfigError(
                f"KUMIKI_TELEMETRY_USAGE_STEP_S: expected <= KUMIKI_TELEMETRY_USAGE_WINDOW_S ({usage_window:g}),"
                f" got {usage_step:g}"
            )
        default, by_queue = parse_idle_rules(
            env_str(env, "KUMIKI_TELEMETRY_IDLE", "default=5:600"), "KUMIKI_TELEMETRY_IDLE"
        )
        return cls(
            gpu_window_s=gpu_window,
            usage_window_s=usage_window,
            usage_step_s=usage_step,
            window_expires_s=seconds("KUMIKI_TELEMETRY_WINDOW_EXPIRES_S", cls.window_expires_s),
            node_timeout_s=env_float(
                env, "KUMIKI_TELEMETRY_NODE_TIMEOUT_S", cls.node_timeout_s, minimum=0.1, maximum=86400
            ),
            publish_interval_s=env_float(
                env, "KUMIKI_TELEMETRY_PUBLISH_INTERVAL_S", cls.publish_interval_s, minimum=0, maximum=3600
            ),
            session_timeout_s=env_float(
                env, "KUMIKI_TELEMETRY_SESSION_TIMEOUT_S", cls.session_timeout_s, minimum=6, maximum=1800
            ),
            batch_window_s=env_float(
                env, "KUMIKI_TELEMETRY_BATCH_WINDOW_S", cls.batch_window_s, minimum=0.01, maximum=10
            ),
            batch_max=env_int(env, "KUMIKI_TELEMETRY_BATCH_MAX", cls.batch_max, minimum=100, maximum=500000),
            idle_default=default,
            idle_by_queue=by_queue,
        )


def parse_idle_rules(text: str, variable: str) -> tuple[IdleRule, dict[str, IdleRule]]:
    """'default=5:600,research=10:1800': queue=threshold_pct:duration_s; errors name the variable and entry."""
    default = TelemetryConfig.idle_default
    by_queue: dict[str, IdleRule] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        queue, sep, rule = entry.partition("=")
        threshold, colon, duration = rule.partition(":")
        if not sep or not colon or not queue.strip():
            raise ConfigError(f"{variable}: expected queue=threshold_pct:duration_s, got {entry!r}")
        try:
            parsed = IdleRule(float(threshold), float(duration))
        except ValueError:
            raise ConfigError(f"{variable}: {entry!r}: threshold and duration must be numbers") from None
        if not 0 < parsed.threshold_pct <= 100 or not math.isfinite(parsed.threshold_pct):
            raise ConfigError(f"{variable}: {entry!r}: threshold must be within (0, 100]")
        if not 0 < parsed.duration_s < math.inf:
            raise ConfigError(f"{variable}: {entry!r}: duration must be > 0 seconds")
        if queue.strip() == "default":
            default = parsed
        else:
            by_queue[queue.strip()] = parsed
    return default, by_queue


# --------------------------------------------------------------------------------------------------
# Readings and chunks


class Reading(NamedTuple):
    """One validated sample, as much of it as ingest uses (a tuple: one is built per sample)."""

    node: str
    gpu_uuid: str
    gpu_index: int
    mig_instance_id: int | None
    timestamp: float
    utilization_pct: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    ecc_uncorrected: int | None
    xid_errors: tuple[int, ...]
    model: str


# XIDs that mean the GPU needs a reset or is gone (NVIDIA's XID catalogue).
FATAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})


@dataclass(slots=True)
class GpuChunk:
    """The readings of one GPU (or MIG instance) inside one chunk."""

    index: int
    mig: int | None
    model: str
    samples: int = 0
    util_n: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    first_ts: float = math.inf
    last_ts: float = 0.0
    last_util: float | None = None
    memory_used_mib: int | None = None
    memory_total_mib: int | None = None
    ecc_uncorrected: int | None = None
    xids: list[int] = field(default_factory=list)

    def add(self, reading: Reading) -> None:
        _, _, _, _, timestamp, utilization_pct, memory_used_mib, memory_total_mib, ecc_uncorrected, xids, _ = reading
        self.samples += 1
        if timestamp < self.first_ts:
            self.first_ts = timestamp
        newest = timestamp >= self.last_ts
        if utilization_pct is not None:
            self.util_n += 1
            self.util_sum += utilization_pct
            if utilization_pct > self.util_max:
                self.util_max = utilization_pct
            if newest:
                self.last_util = utilization_pct
        if newest:
            self.last_ts = timestamp
            self.memory_used_mib = memory_used_mib
            self.memory_total_mib = memory_total_mib
        if ecc_uncorrected is not None:
            self.ecc_uncorrected = max(self.ecc_uncorrected or 0, ecc_uncorrected)
        if xids:
            self.xids.extend(xids)

    def to_json(self) -> list[Any]:
        """An array in field order: the internal topic carries one per GPU per chunk, names would double it."""
        return [
            self.index,
            self.mig,
            self.model,
            self.samples,
            self.util_n,
            self.util_sum,
            self.util_max,
            self.first_ts,
            self.last_ts,
            self.last_util,
            self.memory_used_mib,
            self.memory_total_mib,
            self.ecc_uncorrected,
            self.xids,
        ]

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Sequence[Any]) -> GpuChunk:
        return cls(**data) if isinstance(data, Mapping) else cls(*data)


@dataclass(slots=True)
class NodeChunk:
    """All readings of one node within one time bucket of one consumed batch: one internal record."""

    node: str
    bucket: float
    gpus: dict[str, GpuChunk] = field(default_factory=dict)

    def to_json(self) -> Json:
        return {
            "kind": "readings",
            "node": self.node,
            "bucket": self.bucket,
            "gpus": {key: gpu.to_json() for key, gpu in self.gpus.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeChunk:
        return cls(
            data["node"], float(data["bucket"]), {key: GpuChunk.from_json(gpu) for key, gpu in data["gpus"].items()}
        )


def gpu_key(gpu_uuid: str, mig_instance_id: int | None) -> str:
    return gpu_uuid if mig_instance_id is None else f"{gpu_uuid}/mig-{mig_instance_id}"


def summarise(readings: Iterable[Reading], bucket_s: float) -> list[NodeChunk]:
    """Group a consumed batch by (node, bucket): the hot path sends one record per group, not per sample."""
    chunks: dict[tuple[str, float], NodeChunk] = {}
    floor = math.floor
    for reading in readings:
        node, gpu_uuid, gpu_index, mig, timestamp, _, _, _, _, _, model = reading
        bucket = floor(timestamp / bucket_s) * bucket_s
        chunk = chunks.get((node, bucket))
        if chunk is None:
            chunk = chunks[(node, bucket)] = NodeChunk(node, bucket)
        key = gpu_uuid if mig is None else f"{gpu_uuid}/mig-{mig}"  # gpu_key
        gpu = chunk.gpus.get(key)
        if gpu is None:
            gpu = chunk.gpus[key] = GpuChunk(gpu_index, mig, model)
        gpu.add(reading)
    return list(chunks.values())


@dataclass(frozen=True, slots=True)
class WindowAggregate:
    """What a window table holds per key: sums that merge (so windows can be filled chunk by chunk)."""

    samples: int = 0
    util_n: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    allocated_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    idle_gpu_s: float = 0.0

    @property
    def mean_util_pct(self) -> float | None:
        return self.util_sum / self.util_n if self.util_n else None

    def merge(self, other: WindowAggregate) -> WindowAggregate:
        return WindowAggregate(
            self.samples + other.samples,
            self.util_n + other.util_n,
            self.util_sum + other.util_sum,
            max(self.util_max, other.util_max),
            self.allocated_gpu_s + other.allocated_gpu_s,
            self.used_gpu_s + other.used_gpu_s,
            self.idle_gpu_s + other.idle_gpu_s,
        )

    def to_json(self) -> Json:
        return {k: getattr(self, k) for k in self.__slots__}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | Sequence[float] | None) -> WindowAggregate:
        """Accepts the object form and the array form that node windows store."""
        if not data:
            return cls()
        if isinstance(data, Mapping):
            return cls(**data)
        return cls(int(data[0]), int(data[1]), *data[2:])


def merge_json(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Json:
    """The faust window op: JSON in, JSON out."""
    return WindowAggregate.from_json(old).merge(WindowAggregate.from_json(new)).to_json()


def gpu_aggregate(gpu: GpuChunk) -> WindowAggregate:
    return WindowAggregate(gpu.samples, gpu.util_n, gpu.util_sum, gpu.util_max)


Sums = list[float]  # the WindowAggregate fields in order: node windows store arrays (merged per chunk)


def _sums(value: Mapping[str, Any] | Sequence[float] | None) -> Sums:
    if not value:
        return [0, 0, 0.0, 0.0, 0.0, 0.0, 0.0]
    if type(value) is list:  # the usual case, first: the Mapping check below is an abstract-class one
        return value
    if isinstance(value, Mapping):  # a window written before node windows stored arrays
        return [value[name] for name in WindowAggregate.__slots__]
    return list(value)


def _merge_sums(a: Sums, b: Sums) -> Sums:
    return [a[0] + b[0], a[1] + b[1], a[2] + b[2], max(a[3], b[3]), a[4] + b[4], a[5] + b[5], a[6] + b[6]]


def node_window(chunk: NodeChunk) -> Json:
    """One window value per node: the node's sums and each GPU's, so a chunk is one table write."""
    gpus: dict[str, Sums] = {}
    total: Sums = _sums(None)
    for key, gpu in chunk.gpus.items():
        if gpu.mig is None:
            gpus[key] = sums = [gpu.samples, gpu.util_n, gpu.util_sum, gpu.util_max, 0.0, 0.0, 0.0]
            total = _merge_sums(total, sums)
    return {"node": total, "gpus": gpus}


def merge_node_window(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> Json:
    """The faust window op for node windows (an empty `old` is a window not seen yet)."""
    if not old:
        return dict(new)
    old_gpus: Mapping[str, Any] = old.get("gpus", {})
    gpus = dict(old_gpus)
    for key, value in new["gpus"].items():
        previous = old_gpus.get(key)
        gpus[key] = _merge_sums(_sums(previous), value) if previous else value
    return {"node": _merge_sums(_sums(old.get("node")), new["node"]), "gpus": gpus}


def node_aggregate(chunk: NodeChunk) -> WindowAggregate:
    total = WindowAggregate()
    for gpu in chunk.gpus.values():
        if gpu.mig is None:
            total = total.merge(gpu_aggregate(gpu))
    return total


# --------------------------------------------------------------------------------------------------
# Allocations (job.lifecycle)


@dataclass(frozen=True, slots=True)
class Assignment:
    node: str
    gpu_indices: tuple[int, ...]
    mig_slice: str = ""


@dataclass(frozen=True, slots=True)
class Transition:
    """A job.lifecycle event as the core needs it."""

    job_id: str
    generation: int
    state: int
    queue: str
    assignments: tuple[Assignment, ...]


@dataclass(frozen=True, slots=True)
class AllocationChange:
    """One node's view of a transition: the job holds these GPUs now (or, with no GPUs, none)."""

    node: str
    job_id: str
    generation: int
    queue: str
    gpu_indices: tuple[int, ...]
    holding: bool

    def to_json(self) -> Json:
        return {
            "kind": "allocation",
            "node": self.node,
            "job_id": self.job_id,
            "generation": self.generation,
            "queue": self.queue,
            "gpu_indices": list(self.gpu_indices),
            "holding": self.holding,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AllocationChange:
        return cls(
            data["node"],
            data["job_id"],
            int(data["generation"]),
            data["queue"],
            tuple(data["gpu_indices"]),
            bool(data["holding"]),
        )


@dataclass(frozen=True, slots=True)
class JobPlacement:
    """What the lifecycle table keeps per job: where its current generation holds GPUs."""

    generation: int
    nodes: tuple[str, ...]
    ended: bool

    def to_json(self) -> Json:
        return {"generation": self.generation, "nodes": list(self.nodes), "ended": self.ended}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> JobPlacement | None:
        return cls(int(data["generation"]), tuple(data["nodes"]), bool(data["ended"])) if data else None


def allocation_changes(
    previous: JobPlacement | None, event: Transition
) -> tuple[JobPlacement | None, list[AllocationChange]]:
    """The new placement of the job and the per-node changes to forward.

    An older generation never undoes a newer one; a holding event with new assignments releases the nodes
    it no longer names; an ending event releases every node of the current placement.
    """
    if previous is not None and event.generation < previous.generation:
        return previous, []
    if previous is not None and event.generation == previous.generation and previous.ended:
        return previous, []  # a late BOUND/RUNNING after COMPLETED must not resurrect the allocation
    old_nodes = previous.nodes if previous is not None else ()
    if event.state in ENDING_STATES:
        changes = [AllocationChange(node, event.job_id, event.generation, event.queue, (), False) for node in old_nodes]
        return JobPlacement(event.generation, (), True), changes
    if event.state not in HOLDING_STATES or not event.assignments:
        return previous, []
    per_node: dict[str, set[int]] = {}
    for assignment in event.assignments:
        per_node.setdefault(assignment.node, set()).update(assignment.gpu_indices)
    changes = [
        AllocationChange(node, event.job_id, event.generation, event.queue, tuple(sorted(indices)), True)
        for node, indices in sorted(per_node.items())
    ]
    changes += [
        AllocationChange(node, event.job_id, event.generation, event.queue, (), False)
        for node in old_nodes
        if node not in per_node
    ]
    return JobPlacement(event.generation, tuple(sorted(per_node)), False), changes


# --------------------------------------------------------------------------------------------------
# Node record: what the node table keeps


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


def _evolve(record: NodeRecord, **changes: Any) -> NodeRecord:
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
        holdings[change.job_id] = Holding(
            change.job_id,
            change.generation,
            change.queue,
            change.gpu_indices,
            current.reported_since if same and current else None,
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
    record = _evolve(record, gpus=gpus, last_seen=last_seen, stale=False)
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
    return _evolve(record, holdings={**record.holdings, **changed}), findings


def check_stale(record: NodeRecord, now: float, timeout_s: float) -> NodeRecord:
    """A node that has not reported for `timeout_s` is stale (unhealthy) until its next sample."""
    stale = record.last_seen > 0 and now - record.last_seen > timeout_s
    return record if stale == record.stale else _evolve(record, stale=stale)


# --------------------------------------------------------------------------------------------------
# What cluster.state carries


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
    return _evolve(record, published_digest=digest, published_at=now, version=record.version + 1)


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


# --------------------------------------------------------------------------------------------------
# Known nodes: a sample from a node nobody registered is rejected


class NodeRegistry:
    """Nodes registered by an inventory (the agent, or the DCGM ingest's synthetic one) or by a cluster.state
    record, per source topic: a tombstone on one topic removes the node from that topic only."""

    def __init__(self) -> None:
        self._by_source: dict[str, set[str]] = {}
        self._known: set[str] = set()

    def record(self, source: str, node: str, present: bool) -> None:
        nodes = self._by_source.setdefault(source, set())
        if present:
            nodes.add(node)
            self._known.add(node)
        elif node in nodes:
            nodes.discard(node)
            if not any(node in others for others in self._by_source.values()):
                self._known.discard(node)

    def has(self, source: str, node: str) -> bool:
        return node in self._by_source.get(source, ())

    def __contains__(self, node: object) -> bool:
        return node in self._known

    def __len__(self) -> int:
        return len(self._known)


def unknown_node_reason(node: str, sources: Sequence[str]) -> str:
    """The dead-letter reason: names the field, the node and where a registration was looked for."""
    return f"unknown node: node: {node!r} has no record on {' or '.join(sources)}"
