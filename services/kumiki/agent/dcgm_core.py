"""Pure reading of a dcgm-exporter page (Prometheus text format 0.0.4) into the agent's samples.

Clusters that already run dcgm-exporter get the same `GpuSample`s as the NVML agent produces, with
the exporter's Kubernetes pod labels kept. A malformed line is skipped and reported, never fatal:
one bad series must not hide a node's other GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kumiki.agent.core import GpuDevice, GpuInventory, GpuSample, MigInstance, SampleFields

MIB = 1024 * 1024
SOURCE = "dcgm"

# dcgm-exporter counter -> (SampleFields attribute, scale to the agent's unit).
FIELD_BY_METRIC: Mapping[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("gpu_util_pct", 1.0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("memory_util_pct", 1.0),
    "DCGM_FI_DEV_FB_USED": ("memory_used_bytes", MIB),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    "DCGM_FI_DEV_XID_ERRORS": ("last_xid", 1.0),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("engine_active_ratio", 1.0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ecc_corrected_volatile", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected_volatile", 1.0),
}
# Framebuffer parts (MiB) whose sum is the memory total; DCGM has no total counter by default.
MEMORY_PARTS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
# Counters that describe the whole board even when the exporter labels them with a MIG instance.
GPU_WIDE_METRICS = (
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
)
_INT_FIELDS = {"memory_used_bytes", "last_xid", "ecc_corrected_volatile", "ecc_uncorrected_volatile"}
POD_LABELS = ("pod", "namespace", "container")


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One series' value from an exposition page."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class ParsedPage:
    metrics: tuple[MetricSample, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExporterReading:
    """What one scrape yields: samples, an inventory of what the page shows, and skipped lines."""

    samples: tuple[GpuSample, ...]
    inventory: GpuInventory
    errors: tuple[str, ...] = field(default=())


class _LineError(ValueError):
    pass


# The format is ASCII-framed: names are [a-zA-Z_:][a-zA-Z0-9_:]*, separators are spaces and tabs,
# and lines end at "\n" only. (Python's splitlines/strip/isalnum would also split or trim on
# characters such as \x1e or \u2028 that may legally sit inside a label value.)
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:")
_LABEL_CHARS = _NAME_CHARS - {":"}
_BLANK = " \t"


def _parse_value(text: str) -> float:
    lowered = text.lower()
    if lowered in ("nan",):
        return math.nan
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    try:
        return float(text)
    except ValueError as error:
        raise _LineError(f"value {text!r} is not a number") from error


def _parse_labels(line: str, start: int) -> tuple[dict[str, str], int]:
    """Labels from the '{' at `start`; returns them and the index after the closing '}'."""
    labels: dict[str, str] = {}
    position = start + 1
    length = len(line)
    while True:
        while position < length and line[position] in _BLANK:
            position += 1
        if position < length and line[position] == "}":
            return labels, position + 1
        name_start = position
        while position < length and line[position] in _LABEL_CHARS:
            position += 1
        name = line[name_start:position]
        if not name or position >= length or line[position] != "=":
            raise _LineError(f"bad label name at column {name_start + 1}")
        position += 1
        if position >= length or line[position] != '"':
            raise _LineError(f"label {name} has no quoted value")
        position += 1
        value: list[str] = []
        while True:
            if position >= length:
                raise _LineError(f"label {name} value is not closed")
            char = line[position]
            if char == "\\" and position + 1 < length:
                escaped = line[position + 1]
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(escaped, "\\" + escaped))
                position += 2
                continue
            if char == '"':
                position += 1
                break
            value.append(char)
            position += 1
        if name in labels:
            raise _LineError(f"label {name} given twice")
        labels[name] = "".join(value)
        while position < length and line[position] in _BLANK:
            position += 1
        if position < length and line[position] == ",":
            position += 1
        elif position < length and line[position] == "}":
            return labels, position + 1
        else:
            raise _LineError(f"expected ',' or '}}' after label {name}")


def parse_exposition(text: str) -> ParsedPage:
    """Parse Prometheus text format; comments and blank lines are skipped, bad lines reported."""
    metrics: list[MetricSample] = []
    errors: list[str] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(_BLANK + "\r")
        if not line or line.startswith("#"):
            continue
        try:
            position = 0
            while position < len(line) and line[position] in _NAME_CHARS:
                position += 1
            name = line[:position]
            if not name or name[0].isdigit():
                raise _LineError("no metric name")
            labels: dict[str, str] = {}
            if position < len(line) and line[position] == "{":
                labels, position = _parse_labels(line, position)
            rest = line[position:].replace("\t", " ").split(" ")
            rest = [part for part in rest if part]
            if not rest or len(rest) > 2:
                raise _LineError("expected a value and an optional timestamp")
            timestamp = None
            if len(rest) == 2:
                try:
                    timestamp = int(rest[1])
                except ValueError as error:
                    raise _LineError(f"timestamp {rest[1]!r} is not an integer") from error
            metrics.append(MetricSample(name, labels, _parse_value(rest[0]), timestamp))
        except _LineError as error:
            errors.append(f"line {number}: {error}")
    return ParsedPage(tuple(metrics), tuple(errors))


def _instance_id(labels: Mapping[str, str]) -> int | None:
    raw = labels.get("GPU_I_ID", "")
    return int(raw) if raw.isdigit() else None


@dataclass
class _Series:
    """Everything one (GPU, MIG instance) has on the page."""

    node: str
    uuid: str
    index: int
    instance: int | None
    values: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    timestamp_ms: int | None = None
    model: str | None = None
    profile: str | None = None
    pci_bus_id: str | None = None
    driver: str | None = None


_SeriesKey = tuple[str, str, int | None]


def _collect(page: ParsedPage, node: str | None, errors: list[str]) -> dict[_SeriesKey, _Series]:
    series: dict[_SeriesKey, _Series] = {}
    for metric in page.metrics:
        if metric.name not in FIELD_BY_METRIC and metric.name not in MEMORY_PARTS:
            continue
        labels = metric.labels
        uuid = labels.get("UUID", "")
        gpu = labels.get("gpu", "")
        series_node = node or labels.get("Hostname", "")
        if not uuid or not gpu.isdigit() or not series_node:
            errors.append(f"{metric.name}: series without UUID, gpu index or Hostname skipped")
            continue
        instance = _instance_id(labels)
        key = (series_node, uuid, instance)
        entry = series.get(key)
        if entry is None:
            entry = series[key] = _Series(node=series_node, uuid=uuid, index=int(gpu), instance=instance)
        entry.values[metric.name] = metric.value
        if metric.timestamp_ms is not None:
            entry.timestamp_ms = max(entry.timestamp_ms or 0, metric.timestamp_ms)
        entry.model = entry.model or labels.get("modelName") or None
        entry.profile = entry.profile or labels.get("GPU_I_PROFILE") or None
        entry.pci_bus_id = entry.pci_bus_id or labels.get("pci_bus_id") or None
        entry.driver = entry.driver or labels.get("DCGM_FI_DRIVER_VERSION") or None
        # A GPU shared by several pods shows once per pod; the first pod named is kept.
        if not entry.labels.get("pod"):
            pod_labels = {name: labels[name] for name in POD_LABELS if labels.get(name)}
            if pod_labels:
                entry.labels = pod_labels
    return series


def _hoist_gpu_wide(series: dict[_SeriesKey, _Series]) -> None:
    """In MIG mode dcgm-exporter repeats GPU-wide counters (power, temperature, ECC) on every
    instance. Move them to the GPU's own entry, as NVML reports them, so nobody sums one GPU's
    power over its instances."""
    for entry in list(series.values()):
        if entry.instance is None:
            continue
        wide = {name: entry.values.pop(name) for name in GPU_WIDE_METRICS if name in entry.values}
        if not wide:
            continue
        parent_key = (entry.node, entry.uuid, None)
        parent = series.get(parent_key)
        if parent is None:
            parent = series[parent_key] = _Series(
                node=entry.node,
                uuid=entry.uuid,
                index=entry.index,
                instance=None,
                model=entry.model,
                pci_bus_id=entry.pci_bus_id,
                driver=entry.driver,
                timestamp_ms=entry.timestamp_ms,
            )
        for name, value in wide.items():
            parent.values.setdefault(name, value)


def _fields(values: Mapping[str, float]) -> SampleFields:
    kwargs: dict[str, Any] = {}
    for metric, (attribute, scale) in FIELD_BY_METRIC.items():
        value = values.get(metric)
        if value is None or math.isnan(value):
            continue
        scaled = value * scale
        kwargs[attribute] = round(scaled) if attribute in _INT_FIELDS and math.isfinite(scaled) else scaled
    parts = [values.get(name) for name in MEMORY_PARTS]
    used, free = parts[0], parts[1]
    if used is not None and free is not None and not any(p is not None and math.isnan(p) for p in parts):
        total = sum(p for p in parts if p is not None) * MIB
        if math.isfinite(total):  # an exporter's +Inf must not crash the scrape (found by tests/fuzz)
            kwargs["memory_total_bytes"] = round(total)
    last_xid = kwargs.get("last_xid")
    if last_xid == 0:
        kwargs["last_xid"] = None  # 0 is the exporter's "no XID yet"
    return SampleFields(**kwargs)


def read_exporter_page(text: str, node: str | None, scraped_at: float) -> ExporterReading:
    """Samples and an inventory from one page.

    `node` names the node for every series (a DaemonSet knows its node); None takes each series'
    `Hostname` label. Samples are stamped with the exporter's timestamp where it gives one, else
    `scraped_at`.
    """
    page = parse_exposition(text)
    errors = list(page.errors)
    series = _collect(page, node, errors)
    _hoist_gpu_wide(series)
    models = {entry.uuid: entry.model for entry in series.values() if entry.model}
    samples: list[GpuSample] = []
    for entry in sorted(series.values(), key=lambda s: (s.node, s.index, s.instance is not None, s.instance or 0)):
        samples.append(
            GpuSample(
                node=entry.node,
                gpu_uuid=entry.uuid,
                gpu_index=entry.index,
                mig_instance_id=entry.instance,
                timestamp=entry.timestamp_ms / 1000.0 if entry.timestamp_ms else scraped_at,
                fields=_fields(entry.values),
                labels=dict(entry.labels),
                model=entry.model or models.get(entry.uuid),
                source=SOURCE,
            )
        )
    return ExporterReading(tuple(samples), _inventory(series.values(), node, scraped_at), tuple(errors))


def _inventory(series: Iterable[_Series], node: str | None, scraped_at: float) -> GpuInventory:
    entries = list(series)
    gpus: dict[str, list[_Series]] = {}
    for entry in entries:
        gpus.setdefault(entry.uuid, []).append(entry)
    devices: list[GpuDevice] = []
    for uuid, parts in gpus.items():
        whole = next((p for p in parts if p.instance is None), None)
        instances = sorted((p for p in parts if p.instance is not None), key=lambda p: p.instance or 0)
        total = _fields(whole.values).memory_total_bytes if whole else None
        devices.append(
            GpuDevice(
                index=parts[0].index,
                uuid=uuid,
                name=next((p.model for p in parts if p.model), None),
                memory_total_bytes=total,
                pci_bus_id=next((p.pci_bus_id for p in parts if p.pci_bus_id), None),
                # The page shows MIG instances when MIG is on; without them it cannot tell off from absent.
                mig_enabled=True if instances else None,
                mig_instances=tuple(
                    MigInstance(
                        gpu_instance_id=p.instance or 0,
                        compute_instance_id=None,
                        uuid=None,
                        profile=p.profile,
                        memory_total_bytes=_fields(p.values).memory_total_bytes,
                    )
                    for p in instances
                ),
            )
        )
    devices.sort(key=lambda d: d.index)
    nodes = sorted({entry.node for entry in entries})
    return GpuInventory(
        node=node or (nodes[0] if nodes else ""),
        collected_at=scraped_at,
        driver_version=next((e.driver for e in entries if e.driver), None),
        cuda_driver_version=None,
        gpus=tuple(devices),
    )
