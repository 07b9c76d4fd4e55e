"""Placement's request rules, pure: what makes a Bind request valid.

Placement itself (gang placement over live cluster state) uses the scheduling core `kumiki.sched`.
"""

from __future__ import annotations

from kumiki.common.contracts.v1 import common_pb2, placement_pb2
from kumiki.common.grpcutil import InvalidRequest


def validate_pod(index: int, pod: common_pb2.PodResources) -> None:
    where = f"pods[{index}]"
    forms = sum((pod.gpus > 0, bool(pod.mig_profile), pod.gpu_fraction != 0))
    if forms > 1:
        raise InvalidRequest(where, "set only one of gpus, mig_profile, gpu_fraction")
    if pod.gpu_fraction != 0 and not 0 < pod.gpu_fraction < 1:
        raise InvalidRequest(f"{where}.gpu_fraction", f"must be within (0, 1), got {pod.gpu_fraction}")
    if pod.gpus > 64:
        raise InvalidRequest(f"{where}.gpus", f"must be <= 64 per pod, got {pod.gpus}")


def validate_bind(request: placement_pb2.BindRequest) -> None:
    """Raise InvalidRequest naming the first wrong field."""
    if not request.job.job_id:
        raise InvalidRequest("job.job_id", "required")
    if request.job.generation < 1:
        raise InvalidRequest("job.generation", "must be >= 1")
    if not request.queue:
        raise InvalidRequest("queue", "required")
    if not request.pods:
        raise InvalidRequest("pods", "at least one pod is required")
    for index, pod in enumerate(request.pods):
        validate_pod(index, pod)
    if request.min_members > len(request.pods):
        raise InvalidRequest("min_members", f"must be <= the number of pods ({len(request.pods)})")
