"""What the binder writes on pods: the Binding's annotations once Placement has placed them (read by a device
plugin or DRA driver on the node), and the PodScheduled=False reason while it has not."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kumiki.binder.core.names import (
    GENERATION_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    GPU_INDICES_ANNOTATION,
    GPU_UUIDS_ANNOTATION,
    JOB_ANNOTATION,
    MIG_SLICE_ANNOTATION,
)
from kumiki.binder.core.nodes import Node


@dataclass(frozen=True, slots=True)
class PodAssignment:
    """Where Placement put one pod of a gang: `pod_index` in the request's pods, its node, the GPU indices
    (whole GPUs, or the one GPU holding a MIG slice or a share), the MIG slice as "<profile>@<start>", the
    fraction granted."""

    pod_index: int
    node: str
    gpu_indices: tuple[int, ...] = ()
    mig_slice: str = ""
    gpu_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class PendingReason:
    """Why Placement keeps a gang waiting: a machine-readable `code` (insufficient_gpus, quota_exceeded...),
    the resource and node shape that block, and Placement's own explanation."""

    code: str
    resource: str = ""
    node_shape: str = ""
    message: str = ""


def assignment_annotations(
    job_id: str, generation: int, assignment: PodAssignment, node: Node | None
) -> dict[str, str]:
    """What the pod carries once bound: its job, generation, GPU indices and UUIDs, MIG slice, fraction."""
    annotations = {JOB_ANNOTATION: job_id, GENERATION_ANNOTATION: str(generation)}
    if assignment.gpu_indices:
        annotations[GPU_INDICES_ANNOTATION] = ",".join(str(index) for index in assignment.gpu_indices)
        if node is not None and node.gpu_uuids:
            uuids = [node.gpu_uuids[index] for index in assignment.gpu_indices if index < len(node.gpu_uuids)]
            if len(uuids) == len(assignment.gpu_indices):
                annotations[GPU_UUIDS_ANNOTATION] = ",".join(uuids)
    if assignment.mig_slice:
        annotations[MIG_SLICE_ANNOTATION] = assignment.mig_slice
    if assignment.gpu_fraction:
        annotations[GPU_FRACTION_ANNOTATION] = f"{assignment.gpu_fraction:g}"
    return annotations


def reason_text(reasons: Iterable[PendingReason], queue_position: int = 0) -> tuple[str, str]:
    """(Reason, message) for the PodScheduled=False condition, from Placement's structured reasons."""
    parts = []
    code = "Unschedulable"
    for reason in reasons:
        text = reason.message or reason.code  # Placement's message already names resource and shape
        parts.append(text)
        if reason.code == "quota_exceeded":
            code = "QuotaExceeded"
        elif reason.code in ("never_fits", "no_node_can_hold", "unsatisfiable"):
            code = "NeverFits"
    if queue_position:
        parts.append(f"position {queue_position} in its queue")
    return code, "; ".join(parts) or "waiting for placement"
