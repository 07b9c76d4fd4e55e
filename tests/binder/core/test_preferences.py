"""Scoring hints: preferred node affinity, preferred pod (anti-)affinity and ScheduleAnyway spread read and
refused naming the field, and scored per node with the nodes' PreferNoSchedule taints as kube-scheduler's
default Score plugins do, handed over relative to the most common score."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kumiki.binder import core
from kumiki.binder.core import Placed, PodSpecError, WeightedTerm, node_scores, preferences, spread_constraints
from tests.binder.core.support import node_named

PREF = "preferredDuringSchedulingIgnoredDuringExecution"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
HOST = core.HOSTNAME_LABEL
ZONE = "topology.kubernetes.io/zone"
WEB = {"app": "web"}
LAYOUT = (("a1", "za", "x"), ("a2", "za", "x"), ("b1", "zb", "x"), ("c1", "zc", "y"))
NODES = [node_named(name, {HOST: name, ZONE: zone, "pool": pool}) for name, zone, pool in LAYOUT]


def weighted(weight: int, labels: dict[str, str], key: str = HOST, **extra: Any) -> dict[str, Any]:
    return {
        "weight": weight,
        "podAffinityTerm": {"labelSelector": {"matchLabels": labels}, "topologyKey": key, **extra},
    }


def node_term(weight: int, key: str, *values: str) -> dict[str, Any]:
    return {
        "weight": weight,
        "preference": {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]},
    }


def spread(key: str = ZONE, skew: int = 1, when: str = "ScheduleAnyway", **extra: Any) -> dict[str, Any]:
    return {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": WEB},
        **extra,
    }


def prefs(
    *, nodes: list[Any] | None = None, affinity: list[Any] | None = None, anti: list[Any] | None = None,
    spreads: list[Any] | None = None, labels: dict[str, str] | None = None,
) -> core.Preferences:  # fmt: skip
    spec: dict[str, Any] = {"affinity": {}}
    if nodes is not None:
        spec["affinity"]["nodeAffinity"] = {PREF: nodes}
    if affinity is not None:
        spec["affinity"]["podAffinity"] = {PREF: affinity}
    if anti is not None:
        spec["affinity"]["podAntiAffinity"] = {PREF: anti}
    if spreads is not None:
        spec["topologySpreadConstraints"] = spreads
    return preferences(spec, labels or {})


def web_on(*nodes: str, namespace: str = "ns", labels: dict[str, str] = WEB) -> list[Placed]:
    return [Placed(f"{namespace}/w{i}", namespace, labels, node, ()) for i, node in enumerate(nodes)]


def scores(
    wants: core.Preferences,
    placed: Sequence[Placed] = (),
    *,
    labels: dict[str, str] | None = None,
    rules: core.NodeRules | None = None,
    nodes: list[core.Node] = NODES,
    namespace: str = "ns",
) -> dict[str, int]:
    own = WEB if labels is None else labels
    return node_scores(f"{namespace}/new", namespace, own, rules or core.NodeRules(), wants, placed, nodes)


def test_preferred_terms_are_read_with_their_weights() -> None:
    read = prefs(
        nodes=[node_term(10, ZONE, "za"), {"weight": 90, "preference": {"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["b1"]}]}}],
        affinity=[weighted(5, {"app": "cache"}, ZONE)],
        anti=[weighted(100, WEB)],
        spreads=[spread(), spread(HOST, when="DoNotSchedule")],
    )  # fmt: skip
    assert [weight for weight, _ in read.node_terms] == [10, 90]
    assert read.node_terms[0][1] == (core.Requirement(ZONE, "In", ("za",)),)
    assert read.node_terms[1][1] == (core.Requirement("metadata.name", "In", ("b1",), field=True),)
    assert [(w.weight, w.term.anti, w.term.topology_key) for w in read.pod_terms] == [
        (5, False, ZONE),
        (100, True, HOST),
    ]
    assert [c.topology_key for c in read.spread] == [ZONE]  # the ScheduleAnyway one only
    assert read.any and not core.Preferences().any
    assert not preferences({"affinity": {"podAntiAffinity": {REQ: [weighted(1, WEB)["podAffinityTerm"]]}}}, {}).any


def test_spread_constraints_reads_the_kind_asked_and_validates_every_entry() -> None:
    spec = {"topologySpreadConstraints": [spread(HOST), spread(ZONE, when="DoNotSchedule")]}
    assert [c.topology_key for c in spread_constraints(spec, WEB)] == [ZONE]
    assert [c.topology_key for c in spread_constraints(spec, WEB, when="ScheduleAnyway")] == [HOST]
    bad = {"topologySpreadConstraints": [spread(ZONE, when="DoNotSchedule"), spread(nodeTaintsPolicy="Sometimes")]}
    for when in ("DoNotSchedule", "ScheduleAnyway"):  # the bad ScheduleAnyway entry is refused either way
        with pytest.raises(PodSpecError, match=r"topologySpreadConstraints\[1\]\.nodeTaintsPolicy"):
            spread_constraints(bad, WEB, when=when)


NODE_PREF = f"spec.affinity.nodeAffinity.{PREF}[0]"


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"affinity": {"nodeAffinity": {PREF: [node_term(0, ZONE, "za")]}}}, f"{NODE_PREF}.weight", "1-100"),
        ({"affinity": {"nodeAffinity": {PREF: [node_term(101, ZONE, "za")]}}}, f"{NODE_PREF}.weight", "got 101"),
        ({"affinity": {"nodeAffinity": {PREF: [node_term("5", ZONE, "za")]}}}, f"{NODE_PREF}.weight", "got '5'"),  # type: ignore[arg-type]
        ({"affinity": {"nodeAffinity": {PREF: [node_term(True, ZONE, "za")]}}}, f"{NODE_PREF}.weight", "1-100"),
        ({"affinity": {"nodeAffinity": {PREF: [{"weight": 5}]}}}, f"{NODE_PREF}.preference", "required"),
        ({"affinity": {"nodeAffinity": {PREF: {"weight": 5}}}}, f"nodeAffinity.{PREF}", "list of terms"),
        (
            {"affinity": {"nodeAffinity": {PREF: [{"weight": 5, "preference": {"matchExpressions": [
                {"key": ZONE, "operator": "Near", "values": ["za"]}]}}]}}},
            f"{NODE_PREF}.preference.matchExpressions[0].operator",
            "expected one of In, NotIn",
        ),
        (
            {"affinity": {"nodeAffinity": {PREF: [{"weight": 5, "preference": {"matchFields": [
                {"key": "metadata.labels", "operator": "In", "values": ["x"]}]}}]}}},
            f"{NODE_PREF}.preference.matchFields[0].key",
            "only metadata.name",
        ),
        ({"affinity": {"podAffinity": {PREF: [{"weight": 5}]}}}, f"podAffinity.{PREF}[0].podAffinityTerm", "required"),
        ({"affinity": {"podAntiAffinity": {PREF: [weighted(0, WEB)]}}}, f"podAntiAffinity.{PREF}[0].weight", "1-100"),
        (
            {"affinity": {"podAntiAffinity": {PREF: [{"weight": 5, "podAffinityTerm": {"labelSelector": {}}}]}}},
            f"podAntiAffinity.{PREF}[0].podAffinityTerm.topologyKey",
            "required",
        ),
        ({"affinity": {"podAffinity": {PREF: ["web"]}}}, f"podAffinity.{PREF}[0]", "weighted pod affinity term"),
        ({"topologySpreadConstraints": [spread(skew=0)]}, "topologySpreadConstraints[0].maxSkew", ">= 1"),
    ],
)  # fmt: skip
def test_a_bad_preference_is_refused_naming_the_field(spec: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(PodSpecError) as raised:
        preferences(spec, WEB)
    assert field in str(raised.value) and says in str(raised.value), raised.value


def test_node_affinity_ranks_nodes_by_the_weights_of_the_terms_they_match() -> None:
    # raw: a1, a2 20 (pool x); b1 100 (zb and pool x); c1 0 -> over the best, times NodeAffinity's weight 2:
    # 40, 40, 200, 0, handed over relative to the most common (40)
    wants = prefs(nodes=[node_term(80, ZONE, "zb"), node_term(20, "pool", "x")])
    assert scores(wants) == {"b1": 160, "c1": -40}
    empty = prefs(nodes=[node_term(80, ZONE, "zb"), node_term(20, "pool", "x"), {"weight": 50, "preference": {}}])
    assert scores(empty) == {"b1": 160, "c1": -40}  # an empty term matches no node
    assert scores(prefs(nodes=[node_term(30, ZONE, "nowhere")])) == {}  # matches none: every node alike


def test_an_untolerated_prefer_no_schedule_taint_scores_lower() -> None:
    soft = {"key": "gpu", "value": "old", "effect": "PreferNoSchedule"}
    nodes = [*NODES[:3], node_named("c1", {HOST: "c1", ZONE: "zc"}, [soft])]
    none = core.Preferences()
    assert scores(none, nodes=nodes) == {"c1": -300}  # TaintToleration: 100 -> 0, weight 3; even without prefs
    tolerated = core.node_rules({"tolerations": [{"key": "gpu", "operator": "Exists"}]})
    assert scores(none, nodes=nodes, rules=tolerated) == {}
    other_effect = core.node_rules({"tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]})
    assert scores(none, nodes=nodes, rules=other_effect) == {"c1": -300}
    hard = node_named("c1", {HOST: "c1", ZONE: "zc"}, [{**soft, "effect": "NoSchedule"}])
    assert scores(none, nodes=[*NODES[:3], hard]) == {}  # a blocking taint is the filter's business


def test_preferred_anti_affinity_scores_the_domain_of_a_matching_pod_lower() -> None:
    placed = web_on("a1")
    assert scores(prefs(anti=[weighted(50, WEB)]), placed) == {"a1": -200}
    # zone: za (a1, a2) lower; two nodes at 0 and two at 200: the lower of the most common is the base
    assert scores(prefs(anti=[weighted(50, WEB, ZONE)]), placed) == {"b1": 200, "c1": 200}
    assert scores(prefs(anti=[weighted(50, {"app": "db"})]), placed) == {}  # selects no placed pod


def test_preferred_affinity_scores_the_domain_of_a_matching_pod_higher() -> None:
    placed = [*web_on("b1"), *web_on("c1", labels={"app": "cache"})]
    assert scores(prefs(affinity=[weighted(10, WEB, ZONE)]), placed) == {"b1": 200}
    # both: the heavier term decides the order, each term on its own domain
    both = prefs(affinity=[weighted(10, WEB, ZONE), weighted(30, {"app": "cache"}, ZONE)])
    assert scores(both, placed) == {"b1": 66, "c1": 200}  # raw 10 and 30 over 0..30: 33 and 100, times 2


def test_a_placed_pods_terms_score_the_incoming_pod_both_ways_round() -> None:
    avoids = Placed("ns/loner", "ns", {}, "b1", (), (WeightedTerm(30, core.preferred_terms(
        {"affinity": {"podAntiAffinity": {PREF: [weighted(30, {"team": "x"}, ZONE)]}}})[0].term),))  # fmt: skip
    assert scores(core.Preferences(), [avoids], labels={"team": "x"}) == {"b1": -200}
    assert scores(core.Preferences(), [avoids], labels={"team": "y"}) == {}
    assert scores(core.Preferences(), [avoids], labels={"team": "x"}, namespace="other") == {}  # its namespace only
    required = core.pod_affinity(
        {"affinity": {"podAffinity": {REQ: [weighted(1, {"team": "x"}, ZONE)["podAffinityTerm"]]}}}
    )
    wants_x = Placed("ns/fan", "ns", {}, "c1", required)
    assert scores(core.Preferences(), [wants_x], labels={"team": "x"}) == {"c1": 200}  # hardPodAffinityWeight
    anti = core.pod_affinity({"affinity": {"podAntiAffinity": {REQ: [weighted(1, {"team": "x"})["podAffinityTerm"]]}}})
    assert scores(core.Preferences(), [Placed("ns/no", "ns", {}, "c1", anti)], labels={"team": "x"}) == {}  # a filter


def test_schedule_anyway_spread_prefers_the_emptier_domains() -> None:
    # zones za 2, zb 1, zc 0 web pods; 3 domains: raw count * log(5) rounded -> 3, 2, 0; normalised
    # 100 * (max + min - raw) // max -> 0, 33, 100; times 2
    assert scores(prefs(spreads=[spread()]), web_on("a1", "a2", "b1")) == {"b1": 66, "c1": 200}
    assert scores(prefs(spreads=[spread()]), web_on("a1", "a2", "b1", namespace="other")) == {}  # not its namespace
    assert scores(prefs(spreads=[spread()]), web_on("a1", labels={"app": "db"})) == {}  # not selected
    # a larger maxSkew softens the preference: raw 4 against 2 -> 50 against 100
    assert scores(prefs(spreads=[spread(skew=3)]), web_on("a1")) == {"b1": 100, "c1": 100}


def test_schedule_anyway_spread_does_not_score_nodes_without_the_key_or_excluded_by_policy() -> None:
    bare = node_named("bare", {HOST: "bare"})
    found = scores(prefs(spreads=[spread()]), web_on("a1", "bare"), nodes=[*NODES, bare])
    assert found == {"b1": 200, "c1": 200}  # bare scores 0, with the full zone; its pod counts nowhere
    assert min(found.get(name, 0) for name in ("a1", "a2", "bare")) == 0
    # Honor (default) with a nodeSelector on pool x: c1 is no domain and scores 0; za against zb over log(4)
    pool_x = core.node_rules({"nodeSelector": {"pool": "x"}})
    assert scores(prefs(spreads=[spread()]), web_on("a1"), rules=pool_x) == {"b1": 200}
    ignore = prefs(spreads=[spread(nodeAffinityPolicy="Ignore")])
    assert scores(ignore, web_on("a1"), rules=pool_x) == {"b1": 200, "c1": 200}


def test_nothing_to_prefer_and_no_soft_taints_scores_nothing() -> None:
    placed = [Placed("ns/p", "ns", WEB, "a1", core.pod_affinity({"affinity": {"podAntiAffinity": {REQ: [
        weighted(1, {"team": "x"})["podAffinityTerm"]]}}}))]  # fmt: skip
    assert scores(core.Preferences(), placed) == {}
    assert scores(prefs(anti=[weighted(50, WEB)]), [], nodes=[]) == {}


def test_scores_are_relative_to_the_most_common() -> None:
    # za preferred: a1 and a2 at 200, b1 and c1 at 0; a tie, so the lower is the base
    wants = prefs(nodes=[node_term(10, ZONE, "za")])
    assert scores(wants) == {"a1": 200, "a2": 200}
    a3 = node_named("a3", {HOST: "a3", ZONE: "za"})
    assert scores(wants, nodes=[*NODES, a3]) == {"b1": -200, "c1": -200}  # three at 200 now: the base


def test_the_pod_itself_is_not_a_placed_pod() -> None:
    itself = Placed("ns/new", "ns", WEB, "a1", ())
    assert scores(prefs(anti=[weighted(50, WEB)], spreads=[spread(HOST)]), [itself]) == {}


def test_the_namespaces_a_preferred_term_selects() -> None:
    placed = web_on("a1", namespace="prod")
    assert scores(prefs(anti=[weighted(50, WEB)]), placed) == {}  # its own namespace only
    assert scores(prefs(anti=[weighted(50, WEB, namespaces=["prod"])]), placed) == {"a1": -200}
    assert scores(prefs(anti=[weighted(50, WEB, namespaceSelector={})]), placed) == {"a1": -200}


def test_plugins_add_up_with_their_weights() -> None:
    # node affinity on zb (weight 2) against an untolerated soft taint on b1 (weight 3): the taint wins
    soft = [{"key": "gpu", "value": "old", "effect": "PreferNoSchedule"}]
    nodes = [*NODES[:2], node_named("b1", {HOST: "b1", ZONE: "zb"}, soft), NODES[3]]
    assert scores(prefs(nodes=[node_term(100, ZONE, "zb")]), nodes=nodes) == {"b1": -100}


def test_another_schedulers_pod_keeps_its_preferred_terms() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "legacy", "namespace": "ns", "labels": WEB},
        "spec": {"nodeName": "b1", "affinity": {"podAntiAffinity": {PREF: [weighted(40, {"team": "x"}, ZONE)]}}},
        "status": {"phase": "Running"},
    }
    placed = core.placed_pod(obj)
    assert placed is not None and len(placed.preferred) == 1
    assert (placed.preferred[0].weight, placed.preferred[0].term.anti, placed.terms) == (40, True, ())
    assert scores(core.Preferences(), [placed], labels={"team": "x"}) == {"b1": -200}
    unreadable = {**obj, "spec": {"nodeName": "b1", "affinity": {"podAntiAffinity": {
        REQ: [weighted(1, WEB)["podAffinityTerm"]], PREF: [{"weight": 40}]}}}}  # fmt: skip
    kept = core.placed_pod(unreadable)
    assert kept is not None and kept.preferred == () and len(kept.terms) == 1  # its required terms still read


def test_parse_pod_keeps_the_preferences_and_reports_a_bad_one_on_the_pod() -> None:
    from tests.binder.support import pod_object

    obj = pod_object("ns", "p", gpus=1, labels=WEB)
    obj["metadata"]["uid"] = "u1"
    obj["spec"]["affinity"] = {"podAntiAffinity": {PREF: [weighted(50, WEB)]}}
    pod = core.parse_pod(obj)
    assert not pod.invalid and pod.preferences == prefs(anti=[weighted(50, WEB)])
    assert core.parse_pod(obj, pod).preferences is pod.preferences  # the same uid: taken as read
    assert core.pod_scores(pod, web_on("a1"), NODES) == {"a1": -200}
    obj["metadata"]["uid"] = "u2"
    obj["spec"]["affinity"] = {"nodeAffinity": {PREF: [node_term(0, ZONE, "za")]}}
    bad = core.parse_pod(obj)
    assert f"{NODE_PREF}.weight" in bad.invalid and bad.resources is None


def test_the_prefer_replicas_example_is_read_as_written() -> None:
    """docs/examples/prefer-replicas.yaml: its pod template parses with its three preferences; with one replica
    placed on a1 (zone za) the next goes to the spot node c1 last (its taint untolerated), likes a1 least of the
    others, and a2 and b1 tie (zone za's pull and the spread's push away from it weigh the same). Tolerating the
    taint puts c1 level with them."""
    import yaml

    from tests.conftest import REPO_ROOT

    manifest = yaml.safe_load((REPO_ROOT / "docs" / "examples" / "prefer-replicas.yaml").read_text())
    template = manifest["spec"]["template"]
    labels = {**template["metadata"]["labels"], "pod-template-hash": "7c4b"}  # as the ReplicaSet adds it
    obj = {"metadata": {"name": "embed-serve-1", "namespace": "inference", "labels": labels}, "spec": template["spec"]}
    pod = core.parse_pod(obj)
    assert not pod.invalid and pod.affinity == () and pod.spread == ()
    wants = pod.preferences
    assert len(wants.node_terms) == 1 and len(wants.pod_terms) == 1 and len(wants.spread) == 1
    spot = [{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}]
    nodes = [*NODES[:3], node_named("c1", {HOST: "c1", ZONE: "zc"}, taints=spot)]
    placed = [Placed("inference/embed-serve-0", "inference", labels, "a1", (), wants.pod_terms)]

    def ranked(candidate: core.Pod) -> dict[str, int]:
        found = core.pod_scores(candidate, placed, nodes)
        return {node.name: found.get(node.name, 0) for node in nodes}

    score = ranked(pod)
    assert score["c1"] < score["a1"] < score["a2"] == score["b1"], score
    toleration = {"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}
    score = ranked(core.parse_pod({**obj, "spec": {**template["spec"], "tolerations": [toleration]}}))
    assert score["a1"] < score["a2"] == score["b1"] == score["c1"], score
