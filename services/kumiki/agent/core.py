"""Pure core of the node agent: what a GPU inventory and a sample are, which samples are impossible,
when the next sample tick is due, and how both travel as JSON.

The NVML and DCGM adapters only read raw values; every conversion and judgement lives here so the
telemetry ingest, the simulator and the tests share one definition. No I/O, no asyncio, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol, runtime_checkable

RECORDING_FORMAT = "kumiki.agent.recording/v1"

# nvmlGpuTopologyLevel_t values and the names nvidia-smi topo uses for them.
TOPOLOGY_LEVELS: Mapping[int, str] = {
    0: "INTERNAL",
    10: "SINGLE",
    20: "MULTIPLE",
    30: "HOSTBRIDGE",
    40: "NODE",
    50: "SYSTEM",
}

_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_PCI_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_MIG_PROFILE_IN_NAME = re.compile(r"\bMIG\s+(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)

MIN_INTERVAL_S = 0.01
MAX_INTERVAL_S = 3600.0
MIN_TEMPERATURE_C = -50.0
MAX_TEMPERATURE_C = 200.0


# --------------------------------------------------------------------------------------------------
# Inventory


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG GPU instance (with its compute instance) as the scheduler can hand it to a job."""

    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str | None
    profile: str | None
    memory_total_bytes: int | None
    # Where the instance sits among the GPU's memory slices: placement packs MIG layouts by it.
    placement_start: int | None = None
    placement_size: int | None = None


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU. `mig_enabled` is None where the GPU has no MIG at all."""

    index: int
    uuid: str
    name: str | None
    memory_total_bytes: int | None
    pci_bus_id: str | None
    mig_enabled: bool | None
    mig_instances: tuple[MigInstance, ...] = ()
    nvlinks_active: int | None = None


@dataclass(frozen=True, slots=True)
class GpuPair:
    """How two GPUs of one node reach each other: PCIe common ancestor and direct NVLinks."""

    a: int
    b: int
    topology: str | None
    nvlinks: int
    nvlink_p2p: bool | None


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """What a node has, read once at agent start; placement needs MIG layout and topology from it."""

    node: str
    collected_at: float
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuDevice, ...]
    pairs: tuple[GpuPair, ...] = ()

    def nvlink_peers(self, index: int) -> tuple[int, ...]:
        """GPUs joined to `index` by at least one direct NVLink (or NVLink P2P through a switch)."""
        peers = [
            pair.b if pair.a == index else pair.a
            for pair in self.pairs
            if index in (pair.a, pair.b) and (pair.nvlinks > 0 or pair.nvlink_p2p is True)
        ]
        return tuple(sorted(peers))


def inventory_changes(before: GpuInventory, after: GpuInventory) -> list[str]:
    """What a fresh read of the node says that the one before did not (its time aside), one line per change;
    empty: nothing new to publish."""
    if replace(after, collected_at=before.collected_at) == before:
        return []
    changes = []
    old = {gpu.uuid: gpu for gpu in before.gpus}
    new = {gpu.uuid: gpu for gpu in after.gpus}
    changes += [f"GPU {new[uuid].index} ({uuid}) added" for uuid in new.keys() - old.keys()]
    changes += [f"GPU {old[uuid].index} ({uuid}) gone" for uuid in old.keys() - new.keys()]
    for uuid in sorted(old.keys() & new.keys(), key=lambda key: new[key].index):
        a, b = old[uuid], new[uuid]
        if a.mig_enabled != b.mig_enabled:
            changes.append(f"GPU {b.index}: MIG {'on' if b.mig_enabled else 'off'}")
        if a.mig_instances != b.mig_instances:
            profiles = ", ".join(mig.profile or "?" for mig in b.mig_instances) or "none"
            changes.append(
                f"GPU {b.index}: MIG instances {len(a.mig_instances)} -> {len(b.mig_instances)} ({profiles})"
            )
        if a.nvlinks_active != b.nvlinks_active:
            changes.append(f"GPU {b.index}: active NVLinks {a.nvlinks_active} -> {b.nvlinks_active}")
    return sorted(changes) or ["driver, topology or device details"]


# --------------------------------------------------------------------------------------------------
# Samples


@dataclass(frozen=True, slots=True)
class SampleFields:
    """Measured values; None means the source could not give it (unsupported or failed)."""

    gpu_util_pct: float | None = None
    memory_util_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    ecc_corrected_volatile: int | None = None
    ecc_uncorrected_volatile: int | None = None
    # XID codes reported since the previous sample (NVML events).
    xid_errors: tuple[int, ...] = ()
    # DCGM's XID_ERRORS gauge: the last XID seen, which stays set; not an event.
    last_xid: int | None = None
    # DCGM profiling: fraction of time the graphics/compute engine was active (0..1); works on MIG.
    engine_active_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU, or of one MIG instance of it (`mig_instance_id` = GPU instance id)."""

    node: str
    gpu_uuid: str
    gpu_index: int
    mig_instance_id: int | None
    timestamp: float
    fields: SampleFields
    # Kubernetes pod labels from DCGM (pod, namespace, container) when a pod holds the GPU.
    labels: Mapping[str, str] = field(default_factory=dict)
    # The GPU's model (of the whole board, also on MIG samples) and where the reading came from
    # ("nvml", "dcgm"): carried on each sample so a consumer needs no inventory to label it.
    model: str | None = None
    source: str | None = None


class SampleSink(Protocol):
    """Where samples go: Kafka (`kumiki.gpu.samples`) in production, JSON lines here and in tests."""

    async def publish(self, samples: Sequence[GpuSample]) -> None: ...


@runtime_checkable
class InventorySink(Protocol):
    """A sink that also takes the node inventory (published once at start, before any sample)."""

    async def publish_inventory(self, inventory: GpuInventory) -> None: ...


# --------------------------------------------------------------------------------------------------
# Validation


class SampleRejected(ValueError):
    """An impossible sample; ingest sends it to the dead-letter topic with `reason`."""

    def __init__(self, sample: GpuSample, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.sample = sample
        self.field_name = field_name
        self.reason = reason


def _finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def validate_sample(sample: GpuSample, known_nodes: Collection[str] | None = None) -> GpuSample:
    """Return the sample unchanged, or raise SampleRejected naming the first impossible field.

    `known_nodes` None skips the node check (the agent itself does not know the cluster).
    """

    def reject(name: str, reason: str) -> SampleRejected:
        return SampleRejected(sample, name, reason)

    if not sample.node:
        raise reject("node", "empty")
    if known_nodes is not None and sample.node not in known_nodes:
        raise reject("node", f"unknown node {sample.node!r}")
    if not sample.gpu_uuid:
        raise reject("gpu_uuid", "empty")
    if sample.gpu_index < 0:
        raise reject("gpu_index", f"negative ({sample.gpu_index})")
    if sample.mig_instance_id is not None and sample.mig_instance_id < 0:
        raise reject("mig_instance_id", f"negative ({sample.mig_instance_id})")
    if not _finite(sample.timestamp) or sample.timestamp <= 0:
        raise reject("timestamp", f"not a positive finite time ({sample.timestamp})")
    values = sample.fields
    for name in ("gpu_util_pct", "memory_util_pct"):
        pct: float | None = getattr(values, name)
        if pct is not None and (not _finite(pct) or pct < 0 or pct > 100):
            raise reject(name, f"{pct} is outside 0..100")
    for name in ("memory_used_bytes", "memory_total_bytes", "ecc_corrected_volatile", "ecc_uncorrected_volatile"):
        count: int | None = getattr(values, name)
        if count is not None and count < 0:
            raise reject(name, f"negative ({count})")
    used, total = values.memory_used_bytes, values.memory_total_bytes
    if used is not None and total is not None and used > total:
        raise reject("memory_used_bytes", f"{used} exceeds memory_total_bytes {total}")
    if values.power_w is not None and (not _finite(values.power_w) or values.power_w < 0):
        raise reject("power_w", f"{values.power_w} is not a non-negative finite power")
    temp = values.temperature_c
    if temp is not None and (not _finite(temp) or not MIN_TEMPERATURE_C <= temp <= MAX_TEMPERATURE_C):
        raise reject("temperature_c", f"{temp} is outside {MIN_TEMPERATURE_C}..{MAX_TEMPERATURE_C}")
    ratio = values.engine_active_ratio
    if ratio is not None and (not _finite(ratio) or ratio < 0 or ratio > 1):
        raise reject("engine_active_ratio", f"{ratio} is outside 0..1")
    for xid in values.xid_errors:
        if xid <= 0:
            raise reject("xid_errors", f"XID {xid} is not positive")
    if values.last_xid is not None and values.last_xid < 0:
        raise reject("last_xid", f"negative ({values.last_xid})")
    return sample


def partition_samples(
    samples: Sequence[GpuSample], known_nodes: Collection[str] | None = None
) -> tuple[list[GpuSample], list[SampleRejected]]:
    """Split a batch into accepted samples and rejections, keeping order within each."""
    accepted: list[GpuSample] = []
    rejected: list[SampleRejected] = []
    for sample in samples:
        try:
            accepted.append(validate_sample(sample, known_nodes))
        except SampleRejected as rejection:
            rejected.append(rejection)
    return accepted, rejected


def node_name_error(node: str) -> str | None:
    """Why `node` is not a Kubernetes node name (DNS-1123 subdomain), or None if it is one."""
    if not node:
        return "must not be empty"
    if len(node) > 253:
        return f"is {len(node)} characters long, more than 253"
    if not _NODE_NAME.match(node):
        return f"{node!r} is not a lowercase DNS-1123 name (a-z, 0-9, '-', '.')"
    return None


# --------------------------------------------------------------------------------------------------
# Sample ticks


@dataclass(frozen=True, slots=True)
class TickSchedule:
    """Ticks at origin + k*interval on a monotonic clock.

    A tick that is missed because sampling or publishing ran long is skipped, not made up in a burst:
    the rate never exceeds one sample per GPU per interval, and the schedule does not drift.
    """

    interval_s: float
    origin: float
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if not _finite(self.interval_s) or not MIN_INTERVAL_S <= self.interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"interval_s: {self.interval_s} is outside {MIN_INTERVAL_S}..{MAX_INTERVAL_S} seconds")
        if self.duration_s is not None and (not _finite(self.duration_s) or self.duration_s <= 0):
            raise ValueError(f"duration_s: {self.duration_s} is not a positive number of seconds")

    def next_tick(self, previous: float, now: float) -> tuple[float, int]:
        """The tick after `previous` that is not yet past at `now`, and how many were skipped."""
        candidate = previous + self.interval_s
        if now <= candidate:
            return candidate, 0
        behind = math.floor((now - self.origin) / self.interval_s) + 1
        tick = self.origin + behind * self.interval_s
        skipped = max(0, round((tick - candidate) / self.interval_s))
        return tick, skipped

    def is_due(self, tick: float) -> bool:
        """Whether `tick` still falls inside the run (always, without a duration)."""
        if self.duration_s is None:
            return True
        # A tick exactly at the end is not taken: duration 1 s at 1 Hz is one sample, not two.
        return tick < self.origin + self.duration_s - 1e-9


# --------------------------------------------------------------------------------------------------
# Raw reading conversions shared by the adapters


def topology_name(level: int) -> str:
    """nvidia-smi's name for a topology level; unknown levels keep their number visible."""
    return TOPOLOGY_LEVELS.get(level, f"LEVEL_{level}")


def cuda_version_string(version: int) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def power_watts(milliwatts: int) -> float:
    return milliwatts / 1000.0


def normalise_pci_bus_id(bus_id: str) -> str | None:
    """One spelling for a PCI address: NVML mixes 00000000:07:00.0, 0000:07:00.0 and case."""
    match = _PCI_BUS_ID.match(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def mig_profile(name: str | None, slices: int | None, memory_mb: int | None) -> str | None:
    """The MIG profile ("1g.10gb"): from the device name where NVML puts it, else from attributes."""
    if name:
        match = _MIG_PROFILE_IN_NAME.search(name)
        if match:
            return match.group(1).lower()
    if slices is not None and memory_mb is not None and slices > 0 and memory_mb > 0:
        return f"{slices}g.{math.ceil(memory_mb / 1024)}gb"
    return None


def nvlink_counts(
    bus_ids: Mapping[int, str | None], remote_bus_ids: Mapping[int, Sequence[str]]
) -> dict[tuple[int, int], int]:
    """Direct NVLinks per GPU pair (a < b), from each GPU's active links' remote PCI addresses.

    Both ends report the same link, so each pair counts the larger of the two ends' views (they agree
    on healthy hardware; a link that one side sees down is not counted twice). Links to addresses
    that are not GPUs of this node (NVSwitch, a bridge) are not pairs.
    """
    by_bus = {
        normalised: index
        for index, bus in bus_ids.items()
        if bus is not None and (normalised := normalise_pci_bus_id(bus)) is not None
    }
    seen: dict[tuple[int, int], dict[int, int]] = {}
    for index, remotes in remote_bus_ids.items():
        for remote in remotes:
            normalised = normalise_pci_bus_id(remote)
            peer = by_bus.get(normalised) if normalised is not None else None
            if peer is None or peer == index:
                continue
            key = (min(index, peer), max(index, peer))
            per_end = seen.setdefault(key, {})
            per_end[index] = per_end.get(index, 0) + 1
    return {key: max(per_end.values()) for key, per_end in seen.items()}


# --------------------------------------------------------------------------------------------------
# JSON encoding (recordings, the JSON-lines sink, replay)


class RecordError(ValueError):
    """A recorded inventory or sample that cannot be read back; names the field."""


def _fields_dict(values: SampleFields) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in fields(values):
        value = getattr(values, item.name)
        if item.name == "xid_errors":
            if value:
                out[item.name] = list(value)
        elif value is not None:
            out[item.name] = value
    return out


def sample_to_dict(sample: GpuSample) -> dict[str, Any]:
    """A JSON-ready dict; unset fields are left out so 'not supported' stays distinct from 0."""
    out: dict[str, Any] = {
        "kind": "sample",
        "node": sample.node,
        "gpu_uuid": sample.gpu_uuid,
        "gpu_index": sample.gpu_index,
        "mig_instance_id": sample.mig_instance_id,
        "timestamp": sample.timestamp,
        "fields": _fields_dict(sample.fields),
    }
    if sample.labels:
        out["labels"] = dict(sample.labels)
    if sample.model is not None:
        out["model"] = sample.model
    if sample.source is not None:
        out["source"] = sample.source
    return out


def _require(data: Mapping[str, Any], key: str, kinds: tuple[type, ...], where: str, optional: bool = False) -> Any:
    if key not in data or data[key] is None:
        if optional:
            return None
        raise RecordError(f"{where}{key}: missing")
    value = data[key]
    # bool is an int in Python; a JSON true where a number belongs is still an error.
    if isinstance(value, bool) and bool not in kinds:
        raise RecordError(f"{where}{key}: expected {'/'.join(k.__name__ for k in kinds)}, got bool")
    if not isinstance(value, kinds):
        raise RecordError(f"{where}{key}: expected {'/'.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    return value


_INT_FIELDS = {
    "memory_used_bytes",
    "memory_total_bytes",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "last_xid",
}
_FLOAT_FIELDS = {"gpu_util_pct", "memory_util_pct", "power_w", "temperature_c", "engine_active_ratio"}


def sample_from_dict(data: Mapping[str, Any], where: str = "") -> GpuSample:
    """Read a sample back; structure and types only (impossible values are validate_sample's job)."""
    if not isinstance(data, Mapping):
        raise RecordError(f"{where}sample: expected an object, got {type(data).__name__}")
    kind = data.get("kind", "sample")
    if kind != "sample":
        raise RecordError(f"{where}kind: expected 'sample', got {kind!r}")
    raw_fields = _require(data, "fields", (dict,), where)
    unknown = set(raw_fields) - _INT_FIELDS - _FLOAT_FIELDS - {"xid_errors"}
    if unknown:
        raise RecordError(f"{where}fields.{sorted(unknown)[0]}: unknown field")
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        values[name] = _require(raw_fields, name, (int,), f"{where}fields.", optional=True)
    for name in _FLOAT_FIELDS:
        number = _require(raw_fields, name, (int, float), f"{where}fields.", optional=True)
        values[name] = None if number is None else float(number)
    xids = _require(raw_fields, "xid_errors", (list,), f"{where}fields.", optional=True) or []
    for position, xid in enumerate(xids):
        if isinstance(xid, bool) or not isinstance(xid, int):
            raise RecordError(f"{where}fields.xid_errors[{position}]: expected int")
    labels = _require(data, "labels", (dict,), where, optional=True) or {}
    for key, value in labels.items():
        if not isinstance(value, str):
            raise RecordError(f"{where}labels.{key}: expected str")
    return GpuSample(
        node=_require(data, "node", (str,), where),
        gpu_uuid=_require(data, "gpu_uuid", (str,), where),
        gpu_index=_require(data, "gpu_index", (int,), where),
        mig_instance_id=_require(data, "mig_instance_id", (int,), where, optional=True),
        timestamp=float(_require(data, "timestamp", (int, float), where)),
        fields=SampleFields(xid_errors=tuple(xids), **values),
        labels=dict(labels),
        model=_require(data, "model", (str,), where, optional=True),
        source=_require(data, "source", (str,), where, optional=True),
    )


def inventory_to_dict(inventory: GpuInventory) -> dict[str, Any]:
    return {
        "kind": "inventory",
        "format": RECORDING_FORMAT,
        "node": inventory.node,
        "collected_at": inventory.collected_at,
        "driver_version": inventory.driver_version,
        "cuda_driver_version": inventory.cuda_driver_version,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.name,
                "memory_total_bytes": gpu.memory_total_bytes,
                "pci_bus_id": gpu.pci_bus_id,
                "mig_enabled": gpu.mig_enabled,
                "nvlinks_active": gpu.nvlinks_active,
                "mig_instances": [
                    {
                        "gpu_instance_id": mig.gpu_instance_id,
                        "compute_instance_id": mig.compute_instance_id,
                        "uuid": mig.uuid,
                        "profile": mig.profile,
                        "memory_total_bytes": mig.memory_total_bytes,
                        "placement_start": mig.placement_start,
                        "placement_size": mig.placement_size,
                    }
                    for mig in gpu.mig_instances
                ],
            }
            for gpu in inventory.gpus
        ],
        "pairs": [
            {
                "a": pair.a,
                "b": pair.b,
                "topology": pair.topology,
                "nvlinks": pair.nvlinks,
                "nvlink_p2p": pair.nvlink_p2p,
            }
            for pair in inventory.pairs
        ],
    }


def inventory_from_dict(data: Mapping[str, Any]) -> GpuInventory:
    """Read an inventory back, naming the first bad field."""
    if not isinstance(data, Mapping):
        raise RecordError(f"inventory: expected an object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt != RECORDING_FORMAT:
        raise RecordError(f"format: expected {RECORDING_FORMAT!r}, got {fmt!r}")
    gpus: list[GpuDevice] = []
    for position, raw in enumerate(_require(data, "gpus", (list,), "")):
        where = f"gpus[{position}]."
        if not isinstance(raw, Mapping):
            raise RecordError(f"gpus[{position}]: expected an object")
        migs: list[MigInstance] = []
        for mig_position, mig in enumerate(_require(raw, "mig_instances", (list,), where, optional=True) or []):
            mig_where = f"{where}mig_instances[{mig_position}]."
            if not isinstance(mig, Mapping):
                raise RecordError(f"{mig_where[:-1]}: expected an object")
            migs.append(
                MigInstance(
                    gpu_instance_id=_require(mig, "gpu_instance_id", (int,), mig_where),
                    compute_instance_id=_require(mig, "compute_instance_id", (int,), mig_where, True),
                    uuid=_require(mig, "uuid", (str,), mig_where, True),
                    profile=_require(mig, "profile", (str,), mig_where, True),
                    memory_total_bytes=_require(mig, "memory_total_bytes", (int,), mig_where, True),
                    placement_start=_require(mig, "placement_start", (int,), mig_where, True),
                    placement_size=_require(mig, "placement_size", (int,), mig_where, True),
                )
            )
        gpus.append(
            GpuDevice(
                index=_require(raw, "index", (int,), where),
                uuid=_require(raw, "uuid", (str,), where),
                name=_require(raw, "name", (str,), where, True),
                memory_total_bytes=_require(raw, "memory_total_bytes", (int,), where, True),
                pci_bus_id=_require(raw, "pci_bus_id", (str,), where, True),
                mig_enabled=_require(raw, "mig_enabled", (bool,), where, True),
                mig_instances=tuple(migs),
                nvlinks_active=_require(raw, "nvlinks_active", (int,), where, True),
            )
        )
    pairs: list[GpuPair] = []
    for position, raw in enumerate(_require(data, "pairs", (list,), "", optional=True) or []):
        where = f"pairs[{position}]."
        if not isinstance(raw, Mapping):
            raise RecordError(f"pairs[{position}]: expected an object")
        pairs.append(
            GpuPair(
                a=_require(raw, "a", (int,), where),
                b=_require(raw, "b", (int,), where),
                topology=_require(raw, "topology", (str,), where, True),
                nvlinks=_require(raw, "nvlinks", (int,), where),
                nvlink_p2p=_require(raw, "nvlink_p2p", (bool,), where, True),
            )
        )
    return GpuInventory(
        node=_require(data, "node", (str,), ""),
        collected_at=float(_require(data, "collected_at", (int, float), "")),
        driver_version=_require(data, "driver_version", (str,), "", True),
        cuda_driver_version=_require(data, "cuda_driver_version", (str,), "", True),
        gpus=tuple(gpus),
        pairs=tuple(pairs),
    )


def group_by_timestamp(samples: Sequence[GpuSample]) -> list[list[GpuSample]]:
    """Consecutive samples with one timestamp form one tick's batch (how sources emit them)."""
    batches: list[list[GpuSample]] = []
    for sample in samples:
        if batches and batches[-1][0].timestamp == sample.timestamp:
            batches[-1].append(sample)
        else:
            batches.append([sample])
    return batches
