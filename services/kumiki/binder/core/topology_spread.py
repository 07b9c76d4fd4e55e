"""Required pod topology spread (`topologySpreadConstraints` with `whenUnsatisfiable: DoNotSchedule`), as
kube-scheduler's PodTopologySpread filter: a pod may go only to a domain (the nodes sharing the `topologyKey`
label's value) where the matching pods, it included, would exceed the emptiest eligible domain by at most
`maxSkew`. Resolved by the binder against the placed pods into the same kind of node lists as pod affinity
(`AffinityFilter.keep`). `ScheduleAnyway` constraints are scoring hints: `spread_constraints(..., when=
"ScheduleAnyway")` reads them for `preferences`, which scores nodes with them as kube-scheduler's Score does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kumiki.binder.core.node_rules import NodeRules, Requirement
from kumiki.binder.core.nodes import Node
from kumiki.binder.core.pod_affinity import (
    HOSTNAME_LABEL,
    AffinityFilter,
    GangAffinity,
    Placed,
    label_selector,
    selector_matches,
)
from kumiki.binder.core.quantities import PodSpecError

POLICIES = ("Honor", "Ignore")
WHEN = ("DoNotSchedule", "ScheduleAnyway")


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """One constraint (of the kind asked of `spread_constraints`); `selector` already holds the pod's own
    values of `matchLabelKeys`."""

    max_skew: int
    topology_key: str
    selector: tuple[Requirement, ...] | None  # None: selects no pod (every domain counts 0)
    min_domains: int = 1
    honor_affinity: bool = True  # nodeAffinityPolicy: only nodes the pod's node rules admit are domains
    honor_taints: bool = False  # nodeTaintsPolicy: only nodes whose taints it tolerates are domains
    where: str = ""

    def selects(self, labels: Mapping[str, str]) -> bool:
        return self.selector is not None and selector_matches(self.selector, labels)


def _whole(raw: Any, where: str, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise PodSpecError(where, f"must be a whole number >= {minimum}, got {raw!r}")
    return raw


def _policy(raw: Any, where: str, default: str) -> bool:
    value = default if raw is None else raw
    if value not in POLICIES:
        raise PodSpecError(where, f"expected Honor or Ignore, got {value!r}")
    return bool(value == "Honor")


def spread_constraints(
    spec: Mapping[str, Any], labels: Mapping[str, str], *, when: str = "DoNotSchedule"
) -> tuple[SpreadConstraint, ...]:
    """A pod's topology spread constraints of one kind (`when`: their whenUnsatisfiable), validated
    (PodSpecError names the field). Every entry is validated whichever kind is asked, so a bad constraint makes
    the pod invalid however it is read."""
    if when not in WHEN:
        raise ValueError(f"when: expected DoNotSchedule or ScheduleAnyway, got {when!r}")
    raw = spec.get("topologySpreadConstraints") or []
    if not isinstance(raw, list):
        raise PodSpecError("spec.topologySpreadConstraints", "must be a list")
    constraints: list[SpreadConstraint] = []
    for index, item in enumerate(raw):
        where = f"spec.topologySpreadConstraints[{index}]"
        if not isinstance(item, Mapping):
            raise PodSpecError(where, "must be a topology spread constraint")
        kind = item.get("whenUnsatisfiable")
        if kind not in WHEN:
            raise PodSpecError(f"{where}.whenUnsatisfiable", f"expected DoNotSchedule or ScheduleAnyway, got {kind!r}")
        key = item.get("topologyKey")
        if not isinstance(key, str) or not key:
            raise PodSpecError(f"{where}.topologyKey", "required")
        max_skew = _whole(item.get("maxSkew"), f"{where}.maxSkew", 1)
        selector = label_selector(item.get("labelSelector"), f"{where}.labelSelector")
        keys = item.get("matchLabelKeys") or []
        if not isinstance(keys, list):
            raise PodSpecError(f"{where}.matchLabelKeys", "must be a list of label keys")
        if keys and selector is not None:  # the pod's own values of these keys join the selector
            own = tuple(Requirement(str(name), "In", (labels[str(name)],)) for name in keys if str(name) in labels)
            selector = selector + own
        min_domains = item.get("minDomains")
        constraint = SpreadConstraint(
            max_skew=max_skew,
            topology_key=key,
            selector=selector,
            min_domains=1 if min_domains is None else _whole(min_domains, f"{where}.minDomains", 1),
            honor_affinity=_policy(item.get("nodeAffinityPolicy"), f"{where}.nodeAffinityPolicy", "Honor"),
            honor_taints=_policy(item.get("nodeTaintsPolicy"), f"{where}.nodeTaintsPolicy", "Ignore"),
            where=where,
        )
        if kind == when:
            constraints.append(constraint)
    return tuple(constraints)


def spread_filter(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    constraints: Sequence[SpreadConstraint],
    rules: NodeRules,
    placed: Iterable[Placed],
    nodes: Mapping[str, Node],
) -> AffinityFilter:
    """Each constraint as the domains the pod may go to now (`AffinityFilter.keep`): those whose count of
    matching placed pods in the pod's namespace, plus one if the pod matches itself, is at most `maxSkew`
    above the emptiest eligible domain (taken as 0 while there are fewer than `minDomains`). A node without
    the key is never one."""
    if not constraints:
        return AffinityFilter()
    placed = [other for other in placed if other.namespace == namespace and other.name != name]
    keep: list[tuple[str, frozenset[str], str]] = []
    for constraint in constraints:
        key = constraint.topology_key
        eligible: dict[str, str] = {}  # node name -> its domain
        for node in nodes.values():
            value = node.labels.get(key)
            if value is None:
                continue
            if constraint.honor_affinity and rules.selector_why_not(node):
                continue
            if constraint.honor_taints and rules.taint_why_not(node):
                continue
            eligible[node.name] = value
        counts = dict.fromkeys(eligible.values(), 0)
        for other in placed:
            domain = eligible.get(other.node)
            if domain is not None and constraint.selects(other.labels):
                counts[domain] += 1
        if not counts:
            keep.append((key, frozenset(), f"node(s) didn't match pod topology spread constraints (no node has {key})"))
            continue
        floor = min(counts.values()) if len(counts) >= constraint.min_domains else 0
        itself = 1 if constraint.selects(labels) else 0
        allowed = frozenset(domain for domain, count in counts.items() if count + itself - floor <= constraint.max_skew)
        why = (
            f"node(s) didn't match pod topology spread constraints ({key}: at most {constraint.max_skew} more"
            f" matching pods than its emptiest domain, which has {floor}; {constraint.where})"
        )
        keep.append((key, allowed, why))
    return AffinityFilter(keep=tuple(keep))


def gang_spread(members: Sequence[tuple[Mapping[str, str], tuple[SpreadConstraint, ...]]]) -> GangAffinity:
    """A constraint that selects other pods of the same gang (`members`: each pod's labels and constraints;
    one namespace): on kubernetes.io/hostname its pods go to distinct nodes (stricter than kube-scheduler, which
    may stack up to maxSkew of them once the others are placed; never looser), any other key is refused."""
    distinct = False
    for index, (_, constraints) in enumerate(members):
        for constraint in constraints:
            if not any(constraint.selects(other) for at, (other, _) in enumerate(members) if at != index):
                continue
            if constraint.topology_key != HOSTNAME_LABEL:
                return GangAffinity(
                    refusal=f"{constraint.where}: topology spread between pods of one gang is supported on"
                    f" {HOSTNAME_LABEL} only, not {constraint.topology_key}"
                )
            distinct = True
    return GangAffinity(distinct_nodes=distinct)
