"""A pod as the binder keeps it: its key, gang, phase, validated request, node rules, scoring preferences and
forecasting features (`parse_pod`); where the placed pods let it go (`pod_filter`) and how they score the nodes
for it (`pod_scores`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kumiki.binder.core.names import (
    GENERATION_ANNOTATION,
    JOB_ANNOTATION,
    POD_GROUP_LABEL,
    PREEMPTIBLE_LABEL,
    QUEUE_LABEL,
)
from kumiki.binder.core.node_rules import NodeRules, node_rules
from kumiki.binder.core.nodes import Node
from kumiki.binder.core.pod_affinity import AffinityFilter, Placed, PodAffinityTerm, affinity_filter, pod_affinity
from kumiki.binder.core.preferences import Preferences, node_scores, preferences
from kumiki.binder.core.quantities import PodSpecError
from kumiki.binder.core.requests import Topology, pod_resources, time_limit_of, topology_of
from kumiki.binder.core.topology_spread import SpreadConstraint, spread_constraints, spread_filter
from kumiki.sched.jobs import PodRequest

INT32_MAX = 2**31 - 1
COMMAND_MAX_CHARS = 1024  # a forecasting key, never run: a long argument list need not travel whole


@dataclass(frozen=True, slots=True)
class PodKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Pod:
    """What the binder needs of one pod."""

    key: PodKey
    uid: str
    group: str  # PodGroup name, or "" for a pod that is its own gang
    node: str  # spec.nodeName ("" while unbound)
    phase: str
    deleting: bool
    resources: PodRequest | None  # None when the pod's request is invalid (see `invalid`)
    invalid: str
    queue: str
    priority: int
    preemptible: bool
    topology: Topology
    job_annotation: str  # kumiki.io/job written at bind time ("" before)
    generation_annotation: int
    created_unix_s: float = 0.0  # metadata.creationTimestamp (whole seconds; 0: absent or unreadable)
    rules: NodeRules = field(default_factory=lambda: NodeRules())  # nodeSelector, node affinity, tolerations
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)  # what others' pod affinity selects
    affinity: tuple[PodAffinityTerm, ...] = ()  # required pod affinity and anti-affinity terms
    spread: tuple[SpreadConstraint, ...] = ()  # DoNotSchedule topology spread constraints
    preferences: Preferences = field(default_factory=Preferences)  # what it prefers: scoring, not filtering
    # forecasting features, passed to Placement in the BindRequest
    image: str = ""  # spec.containers[0].image
    command: str = ""  # spec.containers[0] command + args, space-joined, at most COMMAND_MAX_CHARS
    time_limit_s: float | None = None  # spec.activeDeadlineSeconds / kumiki.io/time-limit, the smaller; None: neither

    @property
    def job_id(self) -> str:
        return job_id_for(self.key.namespace, self.group, self.key.name)

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def job_id_for(namespace: str, group: str, pod_name: str) -> str:
    """A gang's job id: `<namespace>/<podgroup>`; a pod without a group is `<namespace>/pod/<pod>`."""
    return f"{namespace}/{group}" if group else f"{namespace}/pod/{pod_name}"


def created_unix_s(metadata: Mapping[str, Any]) -> float:
    """metadata.creationTimestamp (RFC 3339, whole seconds) as Unix seconds; 0.0 when absent or unreadable, so
    a pod the API server stamped oddly is bound all the same and only left out of the latency histogram."""
    raw = metadata.get("creationTimestamp")
    if not isinstance(raw, str) or not raw:
        return 0.0
    try:
        stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return stamp.timestamp() if stamp.tzinfo is not None else 0.0


def _first_container(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = spec.get("containers")
    if isinstance(containers, list) and containers and isinstance(containers[0], Mapping):
        return containers[0]
    return {}


def pod_image(spec: Mapping[str, Any]) -> str:
    """The first container's image ("" when absent): the forecaster keys run times on what runs."""
    return str(_first_container(spec).get("image") or "")


def pod_command(spec: Mapping[str, Any]) -> str:
    """The first container's command and args, space-joined and cut at COMMAND_MAX_CHARS: a forecasting key
    (the same script with the same flags tends to run as long), not something anyone runs, so cutting is safe."""
    container = _first_container(spec)
    parts: list[str] = []
    for key in ("command", "args"):
        value = container.get(key)
        if isinstance(value, list):
            parts.extend(str(part) for part in value)
    return " ".join(parts)[:COMMAND_MAX_CHARS]


def parse_pod(obj: Mapping[str, Any], known: Pod | None = None) -> Pod:
    """A pod as the API returns it. Never raises for a bad request: the pod is kept with `invalid` set, so
    the binder can tell the user on the pod itself. `known`: the same pod (same uid) as read before, whose
    request is taken as it was (a pod's spec does not change; each of its watch events need not re-read it)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    namespace = str(metadata.get("namespace") or "default")
    uid = str(metadata.get("uid") or "")
    invalid = ""
    resources: PodRequest | None = None
    topology = Topology()
    rules = NodeRules()
    affinity: tuple[PodAffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    preferred = Preferences()
    time_limit_s: float | None = None
    if known is not None and uid and known.uid == uid:
        resources, invalid, topology, rules = known.resources, known.invalid, known.topology, known.rules
        time_limit_s, affinity, spread = known.time_limit_s, known.affinity, known.spread
        preferred = known.preferences
    else:
        try:
            resources = pod_resources(metadata, spec)
            topology = topology_of(annotations)
            rules = node_rules(spec)
            affinity = pod_affinity(spec)
            own_labels = labels if isinstance(labels, Mapping) else {}
            spread = spread_constraints(spec, own_labels)
            preferred = preferences(spec, own_labels)
            time_limit_s = time_limit_of(annotations, spec)
        except PodSpecError as error:
            invalid = str(error)
            resources = None
    try:
        generation = int(annotations.get(GENERATION_ANNOTATION) or 0)
    except ValueError:
        generation = 0
    priority = spec.get("priority")
    return Pod(
        key=PodKey(namespace, str(metadata.get("name") or "")),
        uid=uid,
        group=str(labels.get(POD_GROUP_LABEL) or ""),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=metadata.get("deletionTimestamp") is not None,
        resources=resources,
        invalid=invalid,
        queue=str(labels.get(QUEUE_LABEL) or namespace),
        priority=max(-INT32_MAX, min(INT32_MAX, int(priority))) if isinstance(priority, int) else 0,
        preemptible=str(labels.get(PREEMPTIBLE_LABEL) or "").lower() == "true",
        topology=topology,
        job_annotation=str(annotations.get(JOB_ANNOTATION) or ""),
        generation_annotation=generation,
        created_unix_s=created_unix_s(metadata),
        rules=rules,
        labels={str(key): str(value) for key, value in labels.items()} if isinstance(labels, Mapping) else {},
        affinity=affinity,
        spread=spread,
        preferences=preferred,
        image=pod_image(spec),
        command=pod_command(spec),
        time_limit_s=time_limit_s,
    )


def pod_filter(
    pod: Pod,
    placed: Iterable[Placed],
    nodes: Mapping[str, Node],
    peers: Sequence[tuple[str, Mapping[str, str]]] = (),
) -> AffinityFilter:
    """Where the placed pods let `pod` go: its required pod (anti-)affinity, both ways round, and its topology
    spread constraints, at once; `peers`: (namespace, labels) of the pods of its gang placed with it."""
    name, namespace, placed = str(pod.key), pod.key.namespace, list(placed)
    found = affinity_filter(name, namespace, pod.labels, pod.affinity, placed, nodes, peers)
    return found.also(spread_filter(name, namespace, pod.labels, pod.spread, pod.rules, placed, nodes))


def pod_scores(pod: Pod, placed: Iterable[Placed], nodes: Sequence[Node]) -> dict[str, int]:
    """How `pod`'s preferences, the placed pods' preferences about it and the nodes' PreferNoSchedule taints
    score `nodes` (`node_scores`: relative to the most common score, which is left out)."""
    return node_scores(str(pod.key), pod.key.namespace, pod.labels, pod.rules, pod.preferences, placed, nodes)
