"""What a pod asks for, read the way users write it: `nvidia.com/gpu`, one MIG resource, a GPU fraction and
GPU memory by annotation, CPU and memory requests, a topology constraint, a time limit."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kumiki.binder.core.names import (
    GPU_FRACTION_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_MODEL_SELECTOR,
    GPU_RESOURCE,
    MIG_RESOURCE_PREFIX,
    TIME_LIMIT_ANNOTATION,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_LEVELS,
    TOPOLOGY_REQUIRED_ANNOTATION,
)
from kumiki.binder.core.nodes import gpu_model_name
from kumiki.binder.core.quantities import MIB, PodSpecError, quantity
from kumiki.sched.jobs import MIB_PER_GB, PodRequest, RequestError

MAX_AMOUNT = 2**53  # cpu_milli, memory_mib, gpu_memory_mib: Placement's bound (it holds them as doubles)
INT64_MAX = 2**63 - 1  # spec.activeDeadlineSeconds is an int64
DURATION_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_SECONDS = re.compile(rf"[+-]?{_NUMBER}", re.ASCII)  # signed, so "-5" is told "must be positive"
_DURATION = re.compile(rf"(?:{_NUMBER}[smhd])+", re.ASCII)
_DURATION_PART = re.compile(rf"({_NUMBER})([smhd])", re.ASCII)


def _amount(value: float, where: str, unit: str) -> int:
    """A request rounded up to a whole unit, at most MAX_AMOUNT: past 2**64 the uint64 field itself would
    raise (a plain ValueError, not PodSpecError), and from 2**53 Placement refuses it anyway."""
    amount = math.ceil(value)
    if amount > MAX_AMOUNT:
        raise PodSpecError(where, f"at most 2**53 {unit}, got {amount}")
    return amount


def _container_requests(container: Mapping[str, Any], index: int, kind: str) -> dict[str, float]:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {})
    requests.update(resources.get("requests") or {})  # requests win; limits stand in for extended resources
    out: dict[str, float] = {}
    for name, value in requests.items():
        out[name] = quantity(value, f"spec.{kind}[{index}].resources.requests[{name}]")
    return out


def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests: the sum over containers, at least each init container's (as kube-scheduler does)."""
    total: dict[str, float] = {}
    for index, container in enumerate(spec.get("containers") or []):
        for name, value in _container_requests(container, index, "containers").items():
            total[name] = total.get(name, 0.0) + value
    for index, container in enumerate(spec.get("initContainers") or []):
        for name, value in _container_requests(container, index, "initContainers").items():
            total[name] = max(total.get(name, 0.0), value)
    return total


def pod_resources(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> PodRequest:
    """The request of one pod, validated: exactly one GPU form (whole GPUs, one MIG slice, a fraction)."""
    requests = pod_requests(spec)
    annotations = metadata.get("annotations") or {}
    cpu_milli = _amount(requests.get("cpu", 0.0) * 1000, "resources[cpu]", "millicores")
    memory_mib = _amount(requests.get("memory", 0.0) / MIB, "resources[memory]", "MiB")
    gpus = requests.get(GPU_RESOURCE, 0.0)
    if gpus != int(gpus) or gpus < 0:
        raise PodSpecError(f"resources[{GPU_RESOURCE}]", f"must be a whole number, got {gpus:g}")
    if gpus >= 2**32:  # the wire's uint32 would not hold it: the answer of the 64-GPU bound below, given now
        raise PodSpecError(f"resources[{GPU_RESOURCE}]", f"at most 64 GPUs per pod, got {int(gpus)}")
    migs = {
        name[len(MIG_RESOURCE_PREFIX) :]: value
        for name, value in requests.items()
        if name.startswith(MIG_RESOURCE_PREFIX)
    }
    migs = {profile: value for profile, value in migs.items() if value > 0}
    mig_profile = ""
    if migs:
        if len(migs) > 1 or next(iter(migs.values())) != 1:
            raise PodSpecError(f"resources[{MIG_RESOURCE_PREFIX}*]", f"exactly one MIG slice per pod, got {migs}")
        mig_profile = next(iter(migs))
    fraction = 0.0
    fraction_text = annotations.get(GPU_FRACTION_ANNOTATION)
    if fraction_text is not None:
        try:
            fraction = float(fraction_text)
        except ValueError:
            raise PodSpecError(GPU_FRACTION_ANNOTATION, f"not a number: {fraction_text!r}") from None
        if not (math.isfinite(fraction) and 0 < fraction < 1):
            raise PodSpecError(GPU_FRACTION_ANNOTATION, f"must be within (0, 1), got {fraction_text}")
    gpu_memory_mib = 0
    memory_text = annotations.get(GPU_MEMORY_ANNOTATION)
    if memory_text is not None:
        text = str(memory_text).strip()
        mib = float(text) if text.isdigit() else quantity(text, GPU_MEMORY_ANNOTATION) / MIB
        if mib <= 0:
            raise PodSpecError(GPU_MEMORY_ANNOTATION, f"must be positive, got {memory_text!r}")
        gpu_memory_mib = _amount(mib, GPU_MEMORY_ANNOTATION, "MiB")
    forms = (gpus > 0) + bool(mig_profile) + (fraction > 0)
    if forms > 1:
        raise PodSpecError("resources", "ask for only one of nvidia.com/gpu, a MIG resource, a GPU fraction")
    if fraction > 0 and gpu_memory_mib == 0:
        raise PodSpecError(GPU_MEMORY_ANNOTATION, f"required with {GPU_FRACTION_ANNOTATION} (the per-card memory cap)")
    if gpus > 64:
        raise PodSpecError(f"resources[{GPU_RESOURCE}]", f"at most 64 GPUs per pod, got {int(gpus)}")
    model = annotations.get(GPU_MODEL_ANNOTATION) or (spec.get("nodeSelector") or {}).get(GPU_MODEL_SELECTOR)
    try:
        return PodRequest(
            gpus=int(gpus),
            gpu_fraction=fraction,
            # whole MiB up to 2**53 over a power of two: exact, and exactly the same MiB on the wire again
            gpu_memory_gb=gpu_memory_mib / MIB_PER_GB,
            mig_profile=mig_profile,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
            gpu_model=gpu_model_name(str(model)) if model else "",
        )
    except RequestError as error:  # the checks above leave nothing for it to refuse; named all the same
        raise PodSpecError("resources", str(error)) from None


@dataclass(frozen=True, slots=True)
class Topology:
    """A gang's topology constraint: `level` one of the scheduling core's levels ("" none, "nvlink_island",
    "node", "rack"); `required`: never break it (else a preference)."""

    level: str = ""
    required: bool = False


def topology_of(annotations: Mapping[str, str]) -> Topology:
    level_text = annotations.get(TOPOLOGY_ANNOTATION)
    if not level_text:
        return Topology()
    level = TOPOLOGY_LEVELS.get(level_text)
    if level is None:
        raise PodSpecError(TOPOLOGY_ANNOTATION, f"expected one of {', '.join(TOPOLOGY_LEVELS)}, got {level_text!r}")
    required = annotations.get(TOPOLOGY_REQUIRED_ANNOTATION, "false").lower() == "true"
    return Topology(level=level, required=required)


def parse_duration_s(text: str, field: str) -> float:
    """Seconds from plain seconds ("3600", "5400.5") or number+unit parts ("90m", "1h30m", "1d"; units s, m, h,
    d), as users write a run time. Positive and finite, else a PodSpecError naming `field` and the text: a
    limit misread would cap the forecast wrongly, so it is refused rather than guessed."""
    raw = text.strip()
    if _SECONDS.fullmatch(raw):
        seconds = float(raw)
    elif _DURATION.fullmatch(raw):
        seconds = sum(float(number) * DURATION_UNITS_S[unit] for number, unit in _DURATION_PART.findall(raw))
    else:
        raise PodSpecError(field, f"expected seconds or a duration such as 90m, 1h30m, 1d, got {text!r}")
    if not (math.isfinite(seconds) and seconds > 0):
        raise PodSpecError(field, f"must be a positive, finite time, got {text!r}")
    return seconds


def time_limit_of(annotations: Mapping[str, str], spec: Mapping[str, Any]) -> float | None:
    """The run time the pod asks for, in seconds: spec.activeDeadlineSeconds or the kumiki.io/time-limit
    annotation, the smaller when both are given (the kubelet ends the pod at the deadline whatever the
    annotation says); None when neither is."""
    limits: list[float] = []
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, int) or not 0 < deadline <= INT64_MAX:
            raise PodSpecError(
                "spec.activeDeadlineSeconds", f"must be a whole number of seconds from 1 to 2**63 - 1, got {deadline!r}"
            )
        limits.append(float(deadline))
    text = annotations.get(TIME_LIMIT_ANNOTATION)
    if text is not None:
        limits.append(parse_duration_s(str(text), TIME_LIMIT_ANNOTATION))
    return min(limits, default=None)
