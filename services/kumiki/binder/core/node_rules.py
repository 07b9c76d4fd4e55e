"""Where a pod may run: its nodeSelector, required node affinity and tolerations (kube-scheduler's rules),
resolved against the schedulable nodes into the node names Placement is told."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kumiki.binder.core.names import GPU_MODEL_SELECTOR
from kumiki.binder.core.nodes import BLOCKING_EFFECTS, Node, Taint
from kumiki.binder.core.quantities import PodSpecError
from kumiki.sched.jobs import PodRequest

REQUIRED_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str  # "" with Exists: every taint
    operator: str  # Equal or Exists
    value: str
    effect: str  # "" : every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions (or matchFields on metadata.name) entry of a node selector term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...]
    field: bool = False  # matchFields: the key is metadata.name

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        value = name if self.field else labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if value is None or not self.values:
            return False
        try:  # Gt / Lt compare integers
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.operator == "Gt" else number < bound


NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class NodeRules:
    """Where a pod may run: every nodeSelector label, one of the required affinity terms (each term all its
    requirements; no terms: any node), and a toleration for every NoSchedule / NoExecute taint."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Requirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def restricts(self) -> bool:
        """Whether anything but taints can exclude a node."""
        return bool(self.selector or self.terms)

    def admits(self, node: Node) -> bool:
        return self.why_not(node) == ""

    def why_not(self, node: Node) -> str:
        """ "" when the pod may run on the node, else what excludes it (in kube-scheduler's words)."""
        return self.selector_why_not(node) or self.taint_why_not(node)

    def selector_why_not(self, node: Node) -> str:
        """The nodeSelector and required node affinity alone (topology spread's nodeAffinityPolicy)."""
        for key, value in self.selector:
            if node.labels.get(key) != value:
                return "node(s) didn't match Pod's node affinity/selector"
        if self.terms and not any(
            all(requirement.matches(node.labels, node.name) for requirement in term) for term in self.terms
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        return ""

    def taint_why_not(self, node: Node) -> str:
        """The taints alone (topology spread's nodeTaintsPolicy)."""
        for taint in node.taints:
            if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in self.tolerations):
                return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
        return ""


def node_selector_term(raw: Any, where: str) -> tuple[Requirement, ...]:
    """A NodeSelectorTerm (required or preferred node affinity) as requirements, all of which must hold;
    validated (PodSpecError names the field)."""
    if not isinstance(raw, Mapping):
        raise PodSpecError(where, "must be a node selector term")
    requirements: list[Requirement] = []
    for kind, is_field in (("matchExpressions", False), ("matchFields", True)):
        expressions = raw.get(kind) or []
        if not isinstance(expressions, list):
            raise PodSpecError(f"{where}.{kind}", "must be a list")
        for r, expression in enumerate(expressions):
            at = f"{where}.{kind}[{r}]"
            if not isinstance(expression, Mapping):
                raise PodSpecError(at, "must be a node selector requirement")
            operator = str(expression.get("operator") or "")
            if operator not in NODE_OPERATORS:
                raise PodSpecError(f"{at}.operator", f"expected one of {', '.join(NODE_OPERATORS)}, got {operator!r}")
            key = str(expression.get("key") or "")
            if is_field and key != "metadata.name":
                raise PodSpecError(f"{at}.key", "matchFields supports only metadata.name")
            values = expression.get("values") or []
            if not isinstance(values, list):
                raise PodSpecError(f"{at}.values", "must be a list")
            requirements.append(Requirement(key, operator, tuple(str(value) for value in values), is_field))
    return tuple(requirements)


def node_rules(spec: Mapping[str, Any]) -> NodeRules:
    """A pod's nodeSelector, required node affinity and tolerations, validated (PodSpecError names the field)."""
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise PodSpecError("spec.nodeSelector", "must be a map of labels")
    # the GPU model selector is Placement's gpu_model already (pod_resources): not a node list on every pod
    selector = {key: value for key, value in selector.items() if key != GPU_MODEL_SELECTOR}
    terms: list[tuple[Requirement, ...]] = []
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED_AFFINITY) or {}
    for t, term in enumerate(affinity.get("nodeSelectorTerms") or []):
        where = f"spec.affinity.nodeAffinity.{REQUIRED_AFFINITY}.nodeSelectorTerms[{t}]"
        terms.append(node_selector_term(term or {}, where))
    tolerations = tuple(
        Toleration(
            str(item.get("key") or ""),
            str(item.get("operator") or "Equal"),
            str(item.get("value") or ""),
            str(item.get("effect") or ""),
        )
        for item in spec.get("tolerations") or []
        if isinstance(item, Mapping)
    )
    return NodeRules(
        tuple(sorted((str(key), str(value)) for key, value in selector.items())), tuple(terms), tolerations
    )


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """A pod's node rules resolved against the schedulable nodes: what Placement is told (`nodes`: only these,
    or `avoid`: never these, whichever is shorter), or why no node admits it (`none_because`)."""

    nodes: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    none_because: str = ""
    prefer: tuple[tuple[str, int], ...] = ()  # (node, score) sorted by node: the pod's scoring hints (preferences)


def node_choice(
    rules: NodeRules, candidates: Sequence[Node], tainted: bool, also: Callable[[Node], str] | None = None
) -> NodeChoice:
    """`candidates`: the schedulable nodes; `also`: a further refusal (the pod's pod affinity, resolved). No
    rules, no blocking taint anywhere and nothing further: nothing to check."""
    if not rules.restricts and not tainted and also is None:
        return NodeChoice()
    admitted: list[str] = []
    refused: list[str] = []
    first_why = ""
    for node in candidates:
        why = rules.why_not(node) or (also(node) if also is not None else "")
        if why:
            refused.append(node.name)
            first_why = first_why or why
        else:
            admitted.append(node.name)
    if not admitted:
        return NodeChoice(none_because=f"0/{len(candidates)} nodes admit it: {first_why or 'no nodes'}")
    if not refused:
        return NodeChoice()
    if len(admitted) <= len(refused):
        return NodeChoice(nodes=tuple(sorted(admitted)))
    return NodeChoice(avoid=tuple(sorted(refused)))


def with_choice(resources: PodRequest, choice: NodeChoice) -> PodRequest:
    """The pod's request as Placement gets it: its resources, its node rules as node names and its preferences
    as node scores."""
    if not choice.nodes and not choice.avoid and not choice.prefer:
        return resources
    return replace(
        resources,
        nodes=resources.nodes | frozenset(choice.nodes),
        avoid_nodes=resources.avoid_nodes | frozenset(choice.avoid),
        node_preference=choice.prefer or resources.node_preference,
    )
