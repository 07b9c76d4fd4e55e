"""A gang (a PodGroup's pods, or a pod alone): when it is ready to submit, the BindRequest it makes, whether
Placement's logged request still stands, and how its pods' phases end the job."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kumiki.binder.core.node_rules import NodeChoice
from kumiki.binder.core.pods import Pod, PodKey
from kumiki.sched.jobs import PodRequest

GangOutcome = Literal["completed", "failed"]  # how a gang's bound pods ended (None: some still run)


@dataclass
class Gang:
    """The pods of one job (a PodGroup, or a pod alone) and where its scheduling stands."""

    job_id: str
    namespace: str
    group: str
    min_member: int = 0  # from the PodGroup (0: no PodGroup object seen)
    pods: dict[PodKey, Pod] = field(default_factory=dict)
    generation: int = 0  # the last generation submitted (0: never)
    submitted: tuple[PodKey, ...] = ()  # the pods of the request, in its order
    bound: bool = False
    running_published: int = 0  # generation whose RUNNING was published
    released: int = 0  # generation released in placement
    reason: str = ""  # the last pending reason shown on the pods
    reason_checked: float = 0.0  # monotonic time Placement's reason was last shown or asked for (refresh)
    rules_note: str = ""  # what its node rules add to Placement's reason ("on the 2 of 3 nodes ...")
    last_join: float = 0.0  # monotonic time the last pod joined (a group without a PodGroup settles first)
    timeout_s: int = 0  # the PodGroup's scheduleTimeoutSeconds (0: none)
    waiting_since: float = 0.0  # monotonic time of the first submission of the unbound gang (0: none)
    timed_out: bool = False  # scheduleTimeoutSeconds passed: not submitted again until its pods or group change
    # pod (anti-)affinity: the node lists its last submission was told (None: its pods' terms and the placed
    # pods' played no part; (): a pod placed since restricts it, resolve again), and the binder's count of pod
    # moves they were resolved at (stale once it moves on)
    affinity_choices: tuple[NodeChoice, ...] | None = None
    placed_seen: int = 0

    def waiting_count(self) -> int:
        return sum(1 for pod in self.pods.values() if not pod.node and not pod.deleting and not pod.ended)

    def waiting(self) -> list[Pod]:
        return sorted(
            (pod for pod in self.pods.values() if not pod.node and not pod.deleting and not pod.ended),
            key=lambda pod: pod.key.name,
        )

    def submit_order(self) -> tuple[int, float, str]:
        """Where the gang stands among those submitted in one round: higher priority first, then the oldest pod
        (creationTimestamp), then the job id. Placement queues in arrival order, so this is the order users
        see their jobs queued in, whatever order the watch delivered them."""
        pods = list(self.pods.values())
        priority = max((pod.priority for pod in pods), default=0)
        created = [pod.created_unix_s for pod in pods if pod.created_unix_s]
        return -priority, min(created, default=float("inf")), self.job_id

    def ready_to_submit(self) -> bool:
        """A PodGroup waits for minMember pods; a pod alone (or a labelled group without a PodGroup) goes now."""
        waiting = self.waiting()
        if not waiting:
            return False
        if self.group and self.min_member:
            return len(waiting) >= self.min_member
        return True


def bind_request_fields(gang: Gang, pods: Sequence[Pod]) -> dict[str, Any]:
    """The fields of the BindRequest for `pods` (all of them valid), in request order. The forecasting features
    are the first pod's; the time limit is the tightest any pod asks for (the gang's run ends with its first
    pod killed), and absent when none asks (`time_limit_s` is a proto3 optional: unset means no limit)."""
    first = pods[0]
    fields: dict[str, Any] = {
        "queue": first.queue,
        "pods": [pod.resources for pod in pods],
        "min_members": min(gang.min_member, len(pods)) if gang.group and gang.min_member else 0,
        "topology": first.topology,
        "priority_tier": max(pod.priority for pod in pods),
        "preemptible": all(pod.preemptible for pod in pods),
        "name": gang.group or first.key.name,
        "image": first.image,
        "command": first.command,
    }
    limits = [pod.time_limit_s for pod in pods if pod.time_limit_s is not None]
    if limits:
        fields["time_limit_s"] = min(limits)
    return fields


def same_requests(logged: Sequence[PodRequest | None], pods: Sequence[PodRequest | None]) -> bool:
    """Whether Placement's logged request asks for what these pods ask for (node rules and preferences aside:
    they are resolved against the nodes and pods of the moment and change with them). None: a request that could
    not be read."""
    if len(logged) != len(pods):
        return False
    for before, now in zip(logged, pods, strict=True):
        if before is None or now is None:
            return False
        before = replace(before, nodes=frozenset(), avoid_nodes=frozenset(), node_preference=())
        if before != now:
            return False
    return True


def replacements(gang: Gang, logged: Sequence[PodRequest | None], late: Sequence[Pod]) -> list[tuple[int, Pod]]:
    """Pods that joined a placed gang (`late`), each paired with the place of a member that is gone (deleted):
    the index of that member in the gang's request, for a pod asking for what it asked (`logged`: the request
    Placement placed). Placement still holds that member's GPUs for the gang, so the newcomer takes them: a Job
    or training operator that recreates a failed worker gets it back where it was. First come, first paired."""
    vacated = [
        index
        for index, key in enumerate(gang.submitted)
        if key not in gang.pods and index < len(logged) and logged[index] is not None
    ]
    pairs: list[tuple[int, Pod]] = []
    for pod in late:
        for index in vacated:
            if same_requests([logged[index]], [pod.resources]):
                pairs.append((index, pod))
                vacated.remove(index)
                break
    return pairs


def gang_outcome(pods: Iterable[Pod]) -> GangOutcome | None:
    """How a gang's bound pods ended: "completed" when all succeeded, "failed" when any failed once all have
    ended, else None (some still run, or there are none). `adapters.convert.job_state` names it on the wire."""
    phases = [pod.phase for pod in pods]
    if not phases or not all(phase in ("Succeeded", "Failed") for phase in phases):
        return None
    return "failed" if "Failed" in phases else "completed"
