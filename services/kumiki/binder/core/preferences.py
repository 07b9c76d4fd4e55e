"""A pod's scoring hints (preferred node affinity, preferred pod affinity and anti-affinity, ScheduleAnyway
topology spread) and the nodes' PreferNoSchedule taints, scored per node as kube-scheduler's default Score
plugins do (NodeAffinity, TaintToleration, InterPodAffinity, PodTopologySpread: each 0-100 over the nodes
scored, then weighted as its defaults and summed). Placement takes the highest-scoring node that fits, so the
scores are handed over relative to the most common one: most nodes then need no entry at all.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kumiki.binder.core.node_rules import NodeRules, Requirement, node_selector_term
from kumiki.binder.core.nodes import PREFER_NO_SCHEDULE, Node
from kumiki.binder.core.pod_affinity import PREFERRED, Placed, WeightedTerm, preferred_terms, weighted
from kumiki.binder.core.quantities import PodSpecError
from kumiki.binder.core.topology_spread import SpreadConstraint, spread_constraints

MAX_SCORE = 100
# kube-scheduler's default plugin weights, and the weight a placed pod's required affinity term gives a pod it
# selects (hardPodAffinityWeight)
NODE_AFFINITY_WEIGHT = 2
TAINT_TOLERATION_WEIGHT = 3
INTER_POD_AFFINITY_WEIGHT = 2
TOPOLOGY_SPREAD_WEIGHT = 2
HARD_POD_AFFINITY_WEIGHT = 1

NodeTerm = tuple[int, tuple[Requirement, ...]]


@dataclass(frozen=True, slots=True)
class Preferences:
    """What a pod prefers: weighted node selector terms, weighted pod (anti-)affinity terms, and ScheduleAnyway
    spread constraints."""

    node_terms: tuple[NodeTerm, ...] = ()  # preferred node affinity: (weight, requirements, all of them)
    pod_terms: tuple[WeightedTerm, ...] = ()  # preferred podAffinity (anti False) and podAntiAffinity (anti True)
    spread: tuple[SpreadConstraint, ...] = ()  # whenUnsatisfiable: ScheduleAnyway

    @property
    def any(self) -> bool:
        return bool(self.node_terms or self.pod_terms or self.spread)


def preferences(spec: Mapping[str, Any], labels: Mapping[str, str]) -> Preferences:
    """A pod's preferred node affinity, preferred pod (anti-)affinity and ScheduleAnyway spread constraints,
    validated (PodSpecError names the field); `labels`: its own, for the constraints' matchLabelKeys."""
    affinity = spec.get("affinity") or {}
    if not isinstance(affinity, Mapping):
        raise PodSpecError("spec.affinity", "must be an object")
    node_affinity = affinity.get("nodeAffinity") or {}
    if not isinstance(node_affinity, Mapping):
        raise PodSpecError("spec.affinity.nodeAffinity", "must be an object")
    raw = node_affinity.get(PREFERRED) or []
    if not isinstance(raw, list):
        raise PodSpecError(f"spec.affinity.nodeAffinity.{PREFERRED}", "must be a list of terms")
    node_terms: list[NodeTerm] = []
    for t, item in enumerate(raw):
        where = f"spec.affinity.nodeAffinity.{PREFERRED}[{t}]"
        weight, preference = weighted(item, where, "preferred scheduling term", "preference")
        node_terms.append((weight, node_selector_term(preference, f"{where}.preference")))
    return Preferences(
        tuple(node_terms), preferred_terms(spec), spread_constraints(spec, labels, when="ScheduleAnyway")
    )


def node_scores(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    rules: NodeRules,
    prefs: Preferences,
    placed: Iterable[Placed],
    nodes: Sequence[Node],
) -> dict[str, int]:
    """Pod `namespace/name` (its `labels`, node `rules` and `prefs`) scored on `nodes` against the placed pods:
    node name -> its score less the most common score (ties: the lowest), nodes at that score left out, so a
    pod with nothing to prefer among nodes without PreferNoSchedule taints gets {}. Only the order matters:
    a plugin with nothing to score adds the same to every node and is skipped. A placed pod on a node outside
    `nodes` is in no topology domain (its node's labels are unknown)."""
    placed = [other for other in placed if other.name != name]
    plugins = (
        (NODE_AFFINITY_WEIGHT, _node_affinity(prefs.node_terms, nodes)),
        (TAINT_TOLERATION_WEIGHT, _taint_toleration(rules, nodes)),
        (INTER_POD_AFFINITY_WEIGHT, _inter_pod_affinity(namespace, labels, prefs.pod_terms, placed, nodes)),
        (TOPOLOGY_SPREAD_WEIGHT, _topology_spread(namespace, prefs.spread, rules, placed, nodes)),
    )
    scored = [(weight, scores) for weight, scores in plugins if scores is not None]
    if not scored or not nodes:
        return {}
    totals = [sum(weight * scores[i] for weight, scores in scored) for i in range(len(nodes))]
    counts = Counter(totals)
    common = min(counts, key=lambda total: (-counts[total], total))
    return {node.name: total - common for node, total in zip(nodes, totals, strict=True) if total != common}


def _node_affinity(terms: Sequence[NodeTerm], nodes: Sequence[Node]) -> list[int] | None:
    """The weights of the terms each node matches, over the most any node matches (an empty term: none)."""
    if not terms:
        return None
    raw = [
        sum(
            weight
            for weight, requirements in terms
            if requirements and all(r.matches(node.labels, node.name) for r in requirements)
        )
        for node in nodes
    ]
    top = max(raw, default=0)
    return [score * MAX_SCORE // top if top else 0 for score in raw]


def _taint_toleration(rules: NodeRules, nodes: Sequence[Node]) -> list[int] | None:
    """Fewer untolerated PreferNoSchedule taints score higher (reversed over the most any node has)."""
    if not any(taint.effect == PREFER_NO_SCHEDULE for node in nodes for taint in node.taints):
        return None
    raw = [
        sum(
            1
            for taint in node.taints
            if taint.effect == PREFER_NO_SCHEDULE and not any(t.tolerates(taint) for t in rules.tolerations)
        )
        for node in nodes
    ]
    top = max(raw, default=0)
    return [MAX_SCORE - count * MAX_SCORE // top if top else MAX_SCORE for count in raw]


def _inter_pod_affinity(
    namespace: str,
    labels: Mapping[str, str],
    terms: Sequence[WeightedTerm],
    placed: Sequence[Placed],
    nodes: Sequence[Node],
) -> list[int] | None:
    """Per topology domain, the weights of the terms that hold there: the pod's own preferred terms selecting a
    placed pod (+ affinity, - anti) and, both ways round, a placed pod's preferred terms selecting this pod
    (+/-) and its required affinity terms selecting it (+1); min to max over the nodes becomes 0-100."""
    by_name = {node.name: node.labels for node in nodes}
    domains: dict[str, dict[str, int]] = {}  # topology key -> value -> score

    def add(key: str, node_labels: Mapping[str, str], weight: int) -> None:
        value = node_labels.get(key)
        if value is not None:
            values = domains.setdefault(key, {})
            values[value] = values.get(value, 0) + weight

    for other in placed:
        if not (terms or other.preferred or other.terms):
            continue
        node_labels = by_name.get(other.node)
        if node_labels is None:
            continue
        for weight, term in terms:
            if term.selects(namespace, other.namespace, other.labels):
                add(term.topology_key, node_labels, -weight if term.anti else weight)
        for weight, term in other.preferred:
            if term.selects(other.namespace, namespace, labels):
                add(term.topology_key, node_labels, -weight if term.anti else weight)
        for term in other.terms:
            if not term.anti and term.selects(other.namespace, namespace, labels):
                add(term.topology_key, node_labels, HARD_POD_AFFINITY_WEIGHT)
    if not domains:
        return None
    keyed = sorted(domains.items())
    raw = [sum(values.get(node.labels[key], 0) for key, values in keyed if key in node.labels) for node in nodes]
    low, high = min(raw, default=0), max(raw, default=0)
    return [(score - low) * MAX_SCORE // (high - low) if high > low else 0 for score in raw]


def _topology_spread(
    namespace: str,
    constraints: Sequence[SpreadConstraint],
    rules: NodeRules,
    placed: Sequence[Placed],
    nodes: Sequence[Node],
) -> list[int] | None:
    """kube-scheduler's PodTopologySpread score: each constraint's count of matching pods (of the pod's
    namespace) in a node's domain, times log(domains + 2), plus maxSkew - 1, summed; fewer scores higher. A node
    without every constraint's key, or that a constraint's node policies exclude, is not scored (0); pods count
    only on nodes a constraint would score them on, in the domains of the scored nodes."""
    if not constraints:
        return None
    keys = {constraint.topology_key for constraint in constraints}
    selector_ok: dict[str, bool] = {}
    taints_ok: dict[str, bool] = {}

    def eligible(constraint: SpreadConstraint, node: Node) -> bool:
        if constraint.honor_affinity:
            if node.name not in selector_ok:
                selector_ok[node.name] = not rules.selector_why_not(node)
            if not selector_ok[node.name]:
                return False
        if constraint.honor_taints:
            if node.name not in taints_ok:
                taints_ok[node.name] = not rules.taint_why_not(node)
            if not taints_ok[node.name]:
                return False
        return True

    keyed = [node for node in nodes if all(key in node.labels for key in keys)]
    # per constraint: node name -> domain, for the nodes its pods count on
    counted = [{node.name: node.labels[c.topology_key] for node in keyed if eligible(c, node)} for c in constraints]
    scored = [node for node in keyed if all(node.name in domains for domains in counted)]
    counts: list[dict[str, int]] = [
        dict.fromkeys((node.labels[c.topology_key] for node in scored), 0) for c in constraints
    ]
    same_namespace = [other for other in placed if other.namespace == namespace]
    for constraint, domains, count in zip(constraints, counted, counts, strict=True):
        for other in same_namespace:  # a loop per constraint: this runs once per placed pod
            domain = domains.get(other.node)
            if domain is not None and domain in count and constraint.selects(other.labels):
                count[domain] += 1
    weights = [math.log(len(count) + 2) for count in counts]
    raw: dict[str, int] = {}
    for node in scored:
        total = 0.0
        for constraint, count, weight in zip(constraints, counts, weights, strict=True):
            total += count[node.labels[constraint.topology_key]] * weight + constraint.max_skew - 1
        raw[node.name] = math.floor(total + 0.5)  # Go's math.Round, for the non-negative scores here
    low, high = min(raw.values(), default=0), max(raw.values(), default=0)
    return [
        (MAX_SCORE if high == 0 else MAX_SCORE * (high + low - raw[node.name]) // high) if node.name in raw else 0
        for node in nodes
    ]
