"""DoNotSchedule topology spread: constraints read and refused naming the field, resolved against the placed pods
into the domains a pod may go to (skew, minDomains, the node policies, matchLabelKeys), and over a gang's own
pods as distinct nodes."""

from __future__ import annotations

from typing import Any

import pytest

from kumiki.binder import core
from kumiki.binder.core import GangAffinity, Placed, PodSpecError, gang_spread, spread_constraints, spread_filter
from tests.binder.core.support import node_named

HOST = core.HOSTNAME_LABEL
ZONE = "topology.kubernetes.io/zone"
TAINT = [{"key": "gpu", "value": "h100", "effect": "NoSchedule"}]
NODES = {
    name: node_named(name, {HOST: name, ZONE: zone, "pool": pool}, TAINT if name == "c1" else None)
    for name, zone, pool in (("a1", "za", "x"), ("a2", "za", "x"), ("b1", "zb", "x"), ("c1", "zc", "y"))
}
WEB = {"app": "web"}


def constraint(key: str = ZONE, skew: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule",
        "labelSelector": {"matchLabels": WEB},
        **extra,
    }


def web_on(*nodes: str, namespace: str = "ns") -> list[Placed]:
    return [Placed(f"{namespace}/w{i}", namespace, WEB, node, ()) for i, node in enumerate(nodes)]


def admitted(
    items: list[dict[str, Any]],
    placed: list[Placed],
    labels: dict[str, str] | None = None,
    rules: core.NodeRules | None = None,
) -> list[str]:
    own = WEB if labels is None else labels
    found = spread_filter("ns/new", "ns", own, spread_constraints({"topologySpreadConstraints": items}, own),
                          rules or core.NodeRules(), placed, NODES)  # fmt: skip
    return sorted(name for name, node in NODES.items() if not found.why_not(node))


def test_a_pod_goes_only_where_the_skew_stays_within_max_skew() -> None:
    # zones: za has 2 web pods, zb 1, zc 0 -> with this one: za 3-0, zb 2-0 > 1; zc 1-0 fits
    assert admitted([constraint()], web_on("a1", "a2", "b1")) == ["c1"]
    assert admitted([constraint(skew=2)], web_on("a1", "a2", "b1")) == ["b1", "c1"]
    assert admitted([constraint()], []) == list(NODES)
    assert admitted([constraint(HOST)], web_on("a1")) == ["a2", "b1", "c1"]
    # a pod the selector does not match adds nothing of its own: za's 1 above the emptiest is allowed
    assert admitted([constraint()], web_on("a1"), labels={"app": "db"}) == list(NODES)
    # pods of other namespaces are not counted
    assert admitted([constraint()], web_on("a1", "a2", namespace="other")) == list(NODES)


def test_every_constraint_holds_at_once() -> None:
    both = [constraint(), constraint(HOST)]
    assert admitted(both, web_on("a1", "b1")) == ["c1"]  # zones: zc emptiest; hosts: a2 and c1 empty


def test_min_domains_counts_missing_domains_as_empty() -> None:
    # three zones, each with one pod: the emptiest has 1, so any zone takes a second
    assert admitted([constraint()], web_on("a1", "b1", "c1")) == list(NODES)
    # fewer zones than minDomains: the emptiest counts 0, and a second pod per zone is over the skew
    assert admitted([constraint(minDomains=4)], web_on("a1", "b1", "c1")) == []


def test_node_policies_decide_which_nodes_are_domains() -> None:
    rules = core.node_rules({"nodeSelector": {"pool": "x"}})
    # Honor (default): zc is not a domain for a pod that selects pool x (nor a node it may use), so za and zb
    # are the only ones, and zb the emptiest
    assert admitted([constraint()], web_on("a1"), rules=rules) == ["b1"]
    # Ignore: zc counts, it is the emptiest, and zb is level with it
    ignore = [constraint(nodeAffinityPolicy="Ignore")]
    assert admitted(ignore, web_on("a1", "b1"), rules=rules) == ["c1"]
    # taints: Ignore by default (c1's zone counts); Honor drops the tainted node's zone
    assert admitted([constraint(nodeTaintsPolicy="Honor")], web_on("a1", "b1")) == ["a1", "a2", "b1"]


def test_match_label_keys_narrow_the_selector_to_the_pods_own_values() -> None:
    placed = [
        Placed("ns/old", "ns", {**WEB, "rev": "1"}, "a1", ()),
        Placed("ns/o2", "ns", {**WEB, "rev": "1"}, "a2", ()),
    ]
    assert admitted([constraint(matchLabelKeys=["rev"])], placed, labels={**WEB, "rev": "2"}) == list(NODES)
    assert admitted([constraint(matchLabelKeys=["rev"])], placed, labels={**WEB, "rev": "1"}) == ["b1", "c1"]


def test_schedule_anyway_is_a_preference_and_not_read() -> None:
    assert (
        spread_constraints({"topologySpreadConstraints": [constraint(whenUnsatisfiable="ScheduleAnyway")]}, WEB) == ()
    )


@pytest.mark.parametrize(
    ("item", "field", "says"),
    [
        (constraint(maxSkew=0), "[0].maxSkew", "whole number >= 1"),
        (constraint(maxSkew="1"), "[0].maxSkew", "got '1'"),
        (constraint(topologyKey=""), "[0].topologyKey", "required"),
        (constraint(whenUnsatisfiable="Never"), "[0].whenUnsatisfiable", "DoNotSchedule or ScheduleAnyway"),
        (constraint(minDomains=0), "[0].minDomains", ">= 1"),
        (constraint(nodeAffinityPolicy="Always"), "[0].nodeAffinityPolicy", "Honor or Ignore"),
        (constraint(labelSelector={"matchExpressions": [{"key": "app", "operator": "Near"}]}), "operator", "one of"),
    ],
)
def test_a_bad_constraint_is_refused_naming_the_field(item: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(PodSpecError) as raised:
        spread_constraints({"topologySpreadConstraints": [item]}, WEB)
    assert f"spec.topologySpreadConstraints{field}" in str(raised.value) or field in str(raised.value)
    assert says in str(raised.value), raised.value


def test_a_gang_spread_over_its_own_pods_goes_to_distinct_nodes_or_is_refused() -> None:
    host = spread_constraints({"topologySpreadConstraints": [constraint(HOST)]}, WEB)
    zone = spread_constraints({"topologySpreadConstraints": [constraint()]}, WEB)
    assert gang_spread([(WEB, host), (WEB, host)]) == GangAffinity(distinct_nodes=True)
    assert gang_spread([(WEB, host)]) == GangAffinity()  # alone: nothing between pods
    assert gang_spread([(WEB, host), ({"app": "db"}, ())]) == GangAffinity()  # selects no other pod of the gang
    assert "topology.kubernetes.io/zone" in gang_spread([(WEB, zone), (WEB, zone)]).refusal
    assert GangAffinity(level="node").also(GangAffinity(distinct_nodes=True)).refusal


def test_parse_pod_keeps_the_constraints() -> None:
    from tests.binder.support import pod_object

    obj = pod_object("ns", "p", gpus=1, labels=WEB)
    obj["spec"]["topologySpreadConstraints"] = [constraint(HOST)]
    pod = core.parse_pod(obj)
    assert len(pod.spread) == 1 and pod.spread[0].topology_key == HOST
    obj["spec"]["topologySpreadConstraints"] = [constraint(maxSkew=0)]
    assert "maxSkew" in core.parse_pod(obj).invalid
