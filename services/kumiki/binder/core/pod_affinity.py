"""Required inter-pod affinity and anti-affinity (kube-scheduler's InterPodAffinity filter): a pod's terms read
and validated (`pod_affinity`), resolved against the pods already placed into the nodes it must avoid or keep
to (`affinity_filter`, symmetric: a placed pod's anti-affinity keeps matching pods out of its domain too), and
what a gang's own pods ask of each other turned into Placement's gang constraints (`gang_affinity`: distinct
nodes, one node, one rack), since Placement places a gang's pods together and no pod of it is placed yet.

Terms are matched against the pods the binder knows: those with `schedulerName: kumiki`, and other
schedulers' bound pods when it watches them too (`placed_pod`, KUMIKI_BINDER_OTHER_PODS). Preferred terms
(`preferred_terms`, `WeightedTerm`) are read here too, since a placed pod carries them, and scored in `preferences`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kumiki.binder.core.names import NODE_RACK_LABELS
from kumiki.binder.core.node_rules import Requirement
from kumiki.binder.core.nodes import Node
from kumiki.binder.core.quantities import PodSpecError
from kumiki.binder.core.requests import Topology

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
HOSTNAME_LABEL = "kubernetes.io/hostname"
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
KINDS = (("podAffinity", False), ("podAntiAffinity", True))


@dataclass(frozen=True, slots=True)
class PodAffinityTerm:
    """One term: the pods it selects (labels, namespaces) and the topology domain it is about."""

    anti: bool
    topology_key: str
    selector: tuple[Requirement, ...] | None  # None: a term without labelSelector selects no pod
    namespaces: frozenset[str] = frozenset()  # empty: the pod's own namespace (unless all_namespaces)
    all_namespaces: bool = False  # namespaceSelector: {}
    where: str = ""  # the field path, for messages

    def selects(self, owner_namespace: str, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the term of a pod in `owner_namespace` selects a pod in `namespace` with `labels`."""
        if self.selector is None:
            return False
        if not self.all_namespaces:
            if self.namespaces:
                if namespace not in self.namespaces:
                    return False
            elif namespace != owner_namespace:
                return False
        return selector_matches(self.selector, labels)


def selector_matches(selector: tuple[Requirement, ...], labels: Mapping[str, str]) -> bool:
    """Whether a label selector selects `labels` (all its requirements; none: everything)."""
    for requirement in selector:  # a loop, not all(): this runs once per placed pod per term
        if requirement.operator == "In" and len(requirement.values) == 1:  # matchLabels
            if labels.get(requirement.key) != requirement.values[0]:
                return False
        elif not requirement.matches(labels, ""):
            return False
    return True


def label_selector(raw: Any, where: str) -> tuple[Requirement, ...] | None:
    """A metav1.LabelSelector (matchLabels, matchExpressions) as requirements, validated (PodSpecError names the
    field); None for a missing selector, which selects nothing."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise PodSpecError(where, "must be a label selector")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise PodSpecError(f"{where}.matchLabels", "must be a map of labels")
    requirements = [Requirement(str(key), "In", (str(value),)) for key, value in sorted(labels.items())]
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise PodSpecError(f"{where}.matchExpressions", "must be a list")
    for r, expression in enumerate(expressions):
        at = f"{where}.matchExpressions[{r}]"
        if not isinstance(expression, Mapping) or not expression.get("key"):
            raise PodSpecError(f"{at}.key", "required")
        operator = str(expression.get("operator") or "")
        if operator not in SELECTOR_OPERATORS:
            raise PodSpecError(f"{at}.operator", f"expected one of {', '.join(SELECTOR_OPERATORS)}, got {operator!r}")
        values = tuple(str(value) for value in expression.get("values") or [])
        if operator in ("In", "NotIn") and not values:
            raise PodSpecError(f"{at}.values", f"{operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            raise PodSpecError(f"{at}.values", f"{operator} takes no values")
        requirements.append(Requirement(str(expression["key"]), operator, values))
    return tuple(requirements)


def _term(raw: Any, anti: bool, where: str) -> PodAffinityTerm:
    if not isinstance(raw, Mapping):
        raise PodSpecError(where, "must be a pod affinity term")
    topology_key = raw.get("topologyKey")
    if not isinstance(topology_key, str) or not topology_key:
        raise PodSpecError(f"{where}.topologyKey", "required")
    for unsupported in ("matchLabelKeys", "mismatchLabelKeys"):
        if raw.get(unsupported):
            raise PodSpecError(f"{where}.{unsupported}", "not supported by kumiki; write the labels in labelSelector")
    namespaces = raw.get("namespaces") or []
    if not isinstance(namespaces, list):
        raise PodSpecError(f"{where}.namespaces", "must be a list of namespace names")
    namespace_selector = raw.get("namespaceSelector")
    if namespace_selector is not None and not isinstance(namespace_selector, Mapping):
        raise PodSpecError(f"{where}.namespaceSelector", "must be a label selector")
    if namespace_selector and (namespace_selector.get("matchLabels") or namespace_selector.get("matchExpressions")):
        raise PodSpecError(
            f"{where}.namespaceSelector",
            "selecting namespaces by label is not supported by kumiki; list them in namespaces, or {} for all",
        )
    return PodAffinityTerm(
        anti=anti,
        topology_key=topology_key,
        selector=label_selector(raw.get("labelSelector"), f"{where}.labelSelector"),
        namespaces=frozenset(str(name) for name in namespaces),
        all_namespaces=namespace_selector is not None,
        where=where,
    )


def _blocks(spec: Mapping[str, Any], which: str) -> list[tuple[bool, str, list[Any]]]:
    """(anti, field path, raw terms) of podAffinity and podAntiAffinity's `which` list, the shapes validated."""
    affinity = spec.get("affinity") or {}
    if not isinstance(affinity, Mapping):
        raise PodSpecError("spec.affinity", "must be an object")
    found: list[tuple[bool, str, list[Any]]] = []
    for kind, anti in KINDS:
        block = affinity.get(kind) or {}
        if not isinstance(block, Mapping):
            raise PodSpecError(f"spec.affinity.{kind}", "must be an object")
        raw = block.get(which) or []
        if not isinstance(raw, list):
            raise PodSpecError(f"spec.affinity.{kind}.{which}", "must be a list of terms")
        found.append((anti, f"spec.affinity.{kind}.{which}", raw))
    return found


def pod_affinity(spec: Mapping[str, Any]) -> tuple[PodAffinityTerm, ...]:
    """A pod's required podAffinity and podAntiAffinity terms, validated (PodSpecError names the field).
    Preferred terms are scoring hints, read by `preferred_terms` (for `preferences`)."""
    return tuple(
        _term(raw, anti, f"{where}[{t}]")
        for anti, where, terms in _blocks(spec, REQUIRED)
        for t, raw in enumerate(terms)
    )


class WeightedTerm(NamedTuple):
    """A preferred pod (anti-)affinity term: scores `weight` for (affinity) or against (anti) a node."""

    weight: int
    term: PodAffinityTerm


def term_weight(raw: Any, where: str) -> int:
    """A preferred term's weight: a whole number 1-100, as the API server allows."""
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 100:
        raise PodSpecError(where, f"must be 1-100, got {raw!r}")
    return raw


def weighted(raw: Any, at: str, kind: str, field_name: str) -> tuple[int, Any]:
    """A preferred item (`weight` and its `field_name`: a pod affinity term or a node preference), checked."""
    if not isinstance(raw, Mapping):
        raise PodSpecError(at, f"must be a {kind}")
    weight = term_weight(raw.get("weight"), f"{at}.weight")
    if raw.get(field_name) is None:
        raise PodSpecError(f"{at}.{field_name}", "required")
    return weight, raw[field_name]


def preferred_terms(spec: Mapping[str, Any]) -> tuple[WeightedTerm, ...]:
    """A pod's preferred podAffinity and podAntiAffinity terms, validated (PodSpecError names the field)."""
    terms_read: list[WeightedTerm] = []
    for anti, where, terms in _blocks(spec, PREFERRED):
        for t, raw in enumerate(terms):
            at = f"{where}[{t}]"
            weight, term = weighted(raw, at, "weighted pod affinity term", "podAffinityTerm")
            terms_read.append(WeightedTerm(weight, _term(term, anti, f"{at}.podAffinityTerm")))
    return tuple(terms_read)


class Placed(NamedTuple):
    """A pod on a node (bound, or being bound by this binder): what others' terms are matched against."""

    name: str  # namespace/name
    namespace: str
    labels: Mapping[str, str]
    node: str
    terms: tuple[PodAffinityTerm, ...]  # required ones (another scheduler's pod: only anti-affinity)
    preferred: tuple[WeightedTerm, ...] = ()  # scored: symmetry of preferred (anti-)affinity


def placed_pod(obj: Mapping[str, Any]) -> Placed | None:
    """Another scheduler's pod as the API returns it, as a placed pod (None: unbound or ended). Terms this
    binder cannot read (it refuses them on its own pods) are left out: its own scheduler judged them. Of its
    required terms only anti-affinity is kept (all the filter's symmetry needs); its preferred ones are kept for
    scoring, which counts them both ways round."""
    metadata = obj.get("metadata") or {}
    node = str((obj.get("spec") or {}).get("nodeName") or "")
    if not node or str((obj.get("status") or {}).get("phase") or "") in ("Succeeded", "Failed"):
        return None
    namespace = str(metadata.get("namespace") or "default")
    labels = metadata.get("labels") or {}
    try:
        terms = tuple(term for term in pod_affinity(obj.get("spec") or {}) if term.anti)
    except PodSpecError:
        terms = ()
    try:
        preferred = preferred_terms(obj.get("spec") or {})
    except PodSpecError:
        preferred = ()
    return Placed(
        f"{namespace}/{metadata.get('name') or ''}",
        namespace,
        {str(key): str(value) for key, value in labels.items()} if isinstance(labels, Mapping) else {},
        node,
        terms,
        preferred,
    )


@dataclass(frozen=True, slots=True)
class AffinityFilter:
    """A pod's affinity resolved against the placed pods: topology domains it must stay out of (`avoid`: key ->
    value -> why), domains each affinity term keeps it to (`keep`), or why no node can do (`unmet`)."""

    avoid: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    keep: tuple[tuple[str, frozenset[str], str], ...] = ()  # (topology key, values, why a node outside fails)
    unmet: str = ""

    @property
    def restricts(self) -> bool:
        return bool(self.avoid or self.keep or self.unmet)

    def also(self, other: AffinityFilter) -> AffinityFilter:
        """Both filters at once (pod affinity and topology spread)."""
        if not other.restricts:
            return self
        avoid = {key: {**self.avoid.get(key, {}), **values} for key, values in other.avoid.items()}
        return AffinityFilter({**self.avoid, **avoid}, self.keep + other.keep, self.unmet or other.unmet)

    def why_not(self, node: Node) -> str:
        """ "" when the pod's pod (anti-)affinity lets it onto the node, else why not."""
        if self.unmet:
            return self.unmet
        for key, values in self.avoid.items():
            value = node.labels.get(key)
            if value is not None and value in values:
                return values[value]
        for key, allowed, why in self.keep:
            if node.labels.get(key) not in allowed:
                return why
        return ""


def _selector_text(term: PodAffinityTerm) -> str:
    if term.selector is None:
        return "no labelSelector"
    return ", ".join(
        f"{r.key} {r.operator} {list(r.values)}" if r.values else f"{r.key} {r.operator}" for r in term.selector
    )


def affinity_filter(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    terms: Sequence[PodAffinityTerm],
    placed: Iterable[Placed],
    nodes: Mapping[str, Node],
    peers: Sequence[tuple[str, Mapping[str, str]]] = (),
) -> AffinityFilter:
    """Pod `namespace/name` with `labels` and `terms` against the placed pods. An affinity term that no placed
    pod matches admits every node when the pod matches it itself (the first pod of a set, as kube-scheduler
    allows) or it matches one of the pod's gang `peers` (namespace, labels) placed with it (`gang_affinity`),
    and none otherwise. A placed pod on a node without the term's topology key counts nowhere."""
    avoid: dict[str, dict[str, str]] = {}
    domains: list[dict[str, str]] = [{} for _ in terms]  # per term: topology value -> a pod that puts it there
    indexed = list(zip(terms, domains, strict=True))
    for other in placed:
        if other.name == name:
            continue
        node = nodes.get(other.node)
        if node is None:
            continue
        node_labels = node.labels
        for term, found in indexed:
            value = node_labels.get(term.topology_key)
            if value is not None and value not in found and term.selects(namespace, other.namespace, other.labels):
                found[value] = other.name
        for term in other.terms:  # symmetry: its anti-affinity keeps this pod out of its domain
            if not term.anti:
                continue
            value = node_labels.get(term.topology_key)
            barred = avoid.setdefault(term.topology_key, {})
            if value is not None and value not in barred and term.selects(other.namespace, namespace, labels):
                barred[value] = (
                    f"node(s) didn't satisfy existing pods anti-affinity rules (pod {other.name} on {other.node},"
                    f" {term.topology_key}={value})"
                )
    keep: list[tuple[str, frozenset[str], str]] = []
    for term, found in zip(terms, domains, strict=True):
        if term.anti:
            for value, other_name in found.items():
                avoid.setdefault(term.topology_key, {}).setdefault(
                    value,
                    f"node(s) didn't match pod anti-affinity rules (pod {other_name} in {term.topology_key}={value},"
                    f" {term.where})",
                )
        elif found:
            why = f"node(s) didn't match pod affinity rules ({term.topology_key} of {', '.join(sorted(found))})"
            keep.append((term.topology_key, frozenset(found), why))
        elif not any(term.selects(namespace, peer, peer_labels) for peer, peer_labels in ((namespace, labels), *peers)):
            return AffinityFilter(
                unmet=f"no placed pod matches its pod affinity term {term.where} ({_selector_text(term)})"
            )
    return AffinityFilter({key: barred for key, barred in avoid.items() if barred}, tuple(keep))


class GangAffinity(NamedTuple):
    """What a gang's pods' terms ask of each other, as Placement's gang constraints; `refusal` when the terms
    ask for what Placement cannot express (a message naming the term)."""

    distinct_nodes: bool = False
    level: str = ""  # "node" or "rack": the pods must share one ("" none)
    refusal: str = ""

    def also(self, other: GangAffinity) -> GangAffinity:
        if self.refusal or other.refusal:
            return GangAffinity(refusal=self.refusal or other.refusal)
        distinct = self.distinct_nodes or other.distinct_nodes
        level = self.level or other.level
        if distinct and level == "node":
            return GangAffinity(refusal="the gang's pods ask both for one node (podAffinity) and for a node each")
        return GangAffinity(distinct, level)


def gang_affinity(members: Sequence[tuple[str, Mapping[str, str], tuple[PodAffinityTerm, ...]]]) -> GangAffinity:
    """`members`: each pod's (namespace, labels, terms). A term that selects another pod of the same gang:
    anti-affinity on kubernetes.io/hostname gives each pod a node of its own; affinity on the hostname puts
    them on one node, on a rack label (NODE_RACK_LABELS) in one rack. Any other topology key between a gang's
    own pods is refused: Placement spreads and packs by nodes and racks only."""
    distinct = False
    levels: set[str] = set()
    for index, (namespace, _, terms) in enumerate(members):
        for term in terms:
            peers = [
                other
                for position, other in enumerate(members)
                if position != index and term.selects(namespace, other[0], other[1])
            ]
            if not peers:
                continue
            if term.anti and term.topology_key == HOSTNAME_LABEL:
                distinct = True
            elif not term.anti and term.topology_key == HOSTNAME_LABEL:
                levels.add("node")
            elif not term.anti and term.topology_key in NODE_RACK_LABELS:
                levels.add("rack")
            else:
                kind = "anti-affinity" if term.anti else "affinity"
                return GangAffinity(
                    refusal=f"{term.where}: pod {kind} between pods of one gang is supported on"
                    f" {HOSTNAME_LABEL}{'' if term.anti else ' or a rack label'} only, not {term.topology_key}"
                )
    level = "node" if "node" in levels else "rack" if levels else ""
    return GangAffinity(distinct_nodes=distinct).also(GangAffinity(level=level))


STRICTNESS = {"nvlink_island": 0, "node": 1, "rack": 2}


def gang_topology(topology: Topology, shared: GangAffinity) -> Topology:
    """The gang's topology with what its pods' affinity to each other requires: the stricter of the two."""
    if not shared.level:
        return topology
    if topology.required and STRICTNESS.get(topology.level, 3) <= STRICTNESS[shared.level]:
        return topology
    return Topology(level=shared.level, required=True)
