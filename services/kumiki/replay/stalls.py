"""A replay that stops moving says why: when no job has been submitted, bound, preempted or ended for a while
and some wait, the driver asks Placement about the jobs that have waited longest (Explain) and, through
Kubernetes, what their pods say, and logs the answers.

The replay through KWOK once stalled for good with nothing on its console: Placement had bound the job, one of
its pods was told `GroupAlreadyPlaced` by the binder and never ran. Explain's "bound" beside a job the replay
still counts as waiting, and the pod's PodScheduled reason, say that at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kumiki.common.contracts.v1 import placement_pb2

STALL_AFTER_S = 60.0  # wall seconds with nothing moving while jobs wait
STALL_JOBS = 3  # the jobs asked about: those that have waited longest


@dataclass
class StallWatch:
    """Whether the replay stalls now: the progress mark unchanged for `after_s` while jobs wait. Reported again
    only after as long again, so a long stall is a line a minute, not a flood."""

    after_s: float = STALL_AFTER_S
    mark: tuple[int, ...] = ()
    since: float = 0.0

    def due(self, mark: tuple[int, ...], waiting: int, now: float) -> bool:
        if mark != self.mark:
            self.mark, self.since = mark, now
            return False
        if waiting and now - self.since >= self.after_s:
            self.since = now
            return True
        return False


def still_waiting(job_id: str, waited_s: float) -> str:
    """The head of each stall line: the job and how long it has waited (trace seconds)."""
    return f"still waiting: {job_id} has waited {waited_s:,.0f} s"


def placement_said(job_id: str, waited_s: float, reply: placement_pb2.ExplainResponse) -> str:
    """One line: the job, how long it has waited (trace seconds), and Placement's answer to Explain."""
    head = f"{still_waiting(job_id, waited_s)}; placement says {reply.status or 'nothing'}"
    if reply.status == "bound":
        nodes = sorted({assignment.node for assignment in reply.assignments})
        return f"{head} on {', '.join(nodes)}, but its run has not been seen to start"
    reasons = "; ".join(
        f"{reason.code}: {reason.message}" if reason.message else reason.code for reason in reply.reasons
    )
    position = f", position {reply.queue_position} in queue {reply.queue}" if reply.queue_position else ""
    return f"{head}{position}" + (f" ({reasons})" if reasons else "")


def pods_said(pods: Sequence[dict[str, Any]]) -> list[str]:
    """What each of a job's pods says, from the API server's objects: its node or why it has none."""
    lines = []
    for pod in sorted(pods, key=lambda pod: str(pod.get("metadata", {}).get("name", ""))):
        name = pod.get("metadata", {}).get("name", "?")
        node = (pod.get("spec") or {}).get("nodeName")
        status = pod.get("status") or {}
        phase = status.get("phase") or "Pending"
        if node:
            lines.append(f"  pod {name}: {phase} on {node}")
            continue
        scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
        why = f"{scheduled.get('reason')}: {scheduled.get('message')}" if scheduled else "not looked at yet"
        lines.append(f"  pod {name}: {phase}, no node ({why})")
    return lines
