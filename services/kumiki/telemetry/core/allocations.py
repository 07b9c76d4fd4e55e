"""Allocations from job.lifecycle: which GPUs of which nodes a job's current generation holds, and the
per-node changes a transition makes (an older generation never undoes a newer one)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kumiki.telemetry.core.json_types import Json

# Job states as numbers (kumiki.v1.JobState), so the core needs no generated code.
STATE_BOUND = 3
STATE_RUNNING = 4
STATE_PREEMPTED = 6
STATE_COMPLETED = 8
STATE_FAILED = 9
STATE_RELEASED = 10
HOLDING_STATES = frozenset({STATE_BOUND, STATE_RUNNING})
ENDING_STATES = frozenset({STATE_PREEMPTED, STATE_COMPLETED, STATE_FAILED, STATE_RELEASED})


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
