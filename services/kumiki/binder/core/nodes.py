"""A Node as the API describes it (inventory, readiness, taints). The NodeState record Placement reads (merged
with telemetry's view) is built from it in `kumiki.binder.adapters.convert`, outside the core."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kumiki.binder.core.names import (
    GPU_MODEL_SELECTOR,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    NODE_GPU_UUIDS_ANNOTATION,
    NODE_ISLAND_SIZE_LABEL,
    NODE_RACK_LABELS,
    NODE_SHARING_LABEL,
)
from kumiki.binder.core.quantities import MIB, PodSpecError, quantity

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule is a preference: never a reason to refuse
PREFER_NO_SCHEDULE = "PreferNoSchedule"  # lowers the score of a node for pods that do not tolerate it


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


_MODEL = re.compile(r"\b([A-Z]+[0-9]+[A-Z]?)\b")
_MEMORY = re.compile(r"([0-9]+)GB")


def gpu_model_name(product: str, memory_mib: int = 0) -> str:
    """gpu-feature-discovery's product label ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3") as Kumiki's
    model names ("A100-80GB", "H100-80GB": what MIG profiles and the simulator know); unknown forms unchanged."""
    text = product.upper().removeprefix("NVIDIA-").replace("_", "-")
    family = _MODEL.search(text.replace("-", " "))
    if family is None:
        return product
    memory = _MEMORY.search(text)
    gb = int(memory.group(1)) if memory else round(memory_mib / 1024) if memory_mib else 0
    return f"{family.group(1)}-{gb}GB" if gb else family.group(1)


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the API describes it."""

    name: str
    gpus: int
    gpu_model: str
    gpu_memory_mib: int
    mig: bool
    shareable: bool
    island_size: int
    rack: str
    cpu_milli: int
    memory_mib: int
    schedulable: bool  # not cordoned and Ready
    why_not: str
    gpu_uuids: tuple[str, ...]
    labels: Mapping[str, str]
    version: int
    taints: tuple[Taint, ...] = ()


def parse_node(obj: Mapping[str, Any]) -> Node:
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = {str(key): str(value) for key, value in (metadata.get("labels") or {}).items()}
    annotations = metadata.get("annotations") or {}
    name = str(metadata.get("name") or "")
    allocatable = status.get("allocatable") or status.get("capacity") or {}

    def number(key: str, default: float = 0.0) -> float:
        try:
            return quantity(allocatable[key], f"status.allocatable[{key}]") if key in allocatable else default
        except PodSpecError:
            return default

    mig = any(key.startswith(MIG_RESOURCE_PREFIX) and number(key) > 0 for key in allocatable)
    gpus = int(number(GPU_RESOURCE))
    count_label = labels.get("nvidia.com/gpu.count", "")
    if count_label.isdigit() and (mig or gpus == 0):
        gpus = int(count_label)  # in MIG mode the whole GPUs are not advertised as nvidia.com/gpu
    memory_label = labels.get("nvidia.com/gpu.memory", "")
    island_label = labels.get(NODE_ISLAND_SIZE_LABEL, "")
    island = int(island_label) if island_label.isdigit() and int(island_label) > 0 else gpus
    rack = next((labels[key] for key in NODE_RACK_LABELS if labels.get(key)), "")
    ready = any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )
    cordoned = bool(spec.get("unschedulable"))
    why_not = "cordoned (spec.unschedulable)" if cordoned else ("" if ready else "not Ready")
    uuids = tuple(
        part.strip() for part in str(annotations.get(NODE_GPU_UUIDS_ANNOTATION) or "").split(",") if part.strip()
    )
    version_text = str(metadata.get("resourceVersion") or "0")
    return Node(
        name=name,
        gpus=gpus,
        gpu_model=gpu_model_name(labels[GPU_MODEL_SELECTOR], int(memory_label) if memory_label.isdigit() else 0)
        if labels.get(GPU_MODEL_SELECTOR)
        else ("gpu" if gpus else ""),
        gpu_memory_mib=int(memory_label) if memory_label.isdigit() else 0,
        mig=mig,
        shareable=labels.get(NODE_SHARING_LABEL, "") in ("time-slicing", "mps")
        or labels.get("kumiki.io/gpu-sharing") == "true",
        island_size=max(1, min(island, gpus)) if gpus else 1,
        rack=rack,
        cpu_milli=int(number("cpu") * 1000),
        memory_mib=int(number("memory") / MIB),
        schedulable=not why_not,
        why_not=why_not,
        gpu_uuids=uuids,
        labels=labels,
        version=int(version_text) if version_text.isdigit() else 0,
        taints=node_taints(spec),
    )


def node_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(item.get("key") or ""), str(item.get("value") or ""), str(item.get("effect") or ""))
        for item in spec.get("taints") or []
        if isinstance(item, Mapping)
    )
