"""Required pod affinity and anti-affinity: terms read and refused naming the field, resolved against the placed
pods (both ways round), and a gang's terms on its own pods turned into Placement's gang constraints."""

from __future__ import annotations

from typing import Any

import pytest

from kumiki.binder import core
from kumiki.binder.core import Placed, PodSpecError, Topology, affinity_filter, gang_affinity, gang_topology
from tests.binder.core.support import node_named

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
IN_NOTHING = {"key": "k", "operator": "In"}
NODES = {
    name: node_named(name, {HOST: name, ZONE: zone})
    for name, zone in (("a1", "za"), ("a2", "za"), ("b1", "zb"), ("c1", "zc"))
}


def term(labels: dict[str, str], key: str = HOST, **extra: Any) -> dict[str, Any]:
    return {"labelSelector": {"matchLabels": labels}, "topologyKey": key, **extra}


def terms(*, affinity: list[Any] | None = None, anti: list[Any] | None = None) -> tuple[core.PodAffinityTerm, ...]:
    spec: dict[str, Any] = {"affinity": {}}
    if affinity is not None:
        spec["affinity"]["podAffinity"] = {REQ: affinity}
    if anti is not None:
        spec["affinity"]["podAntiAffinity"] = {REQ: anti}
    return core.pod_affinity(spec)


def on(node: str, labels: dict[str, str], namespace: str = "ns", name: str = "", **kind: Any) -> Placed:
    return Placed(f"{namespace}/{name or node}", namespace, labels, node, terms(**kind) if kind else ())


def admitted(
    pod_terms: tuple[core.PodAffinityTerm, ...],
    placed: list[Placed],
    labels: dict[str, str] | None = None,
    namespace: str = "ns",
    peers: tuple[tuple[str, dict[str, str]], ...] = (),
) -> list[str]:
    found = affinity_filter(f"{namespace}/new", namespace, labels or {}, pod_terms, placed, NODES, peers)
    return sorted(name for name, node in NODES.items() if not found.why_not(node))


def test_anti_affinity_keeps_the_pod_out_of_each_domain_a_matching_pod_is_in() -> None:
    placed = [on("a1", {"app": "web"}), on("b1", {"app": "db"})]
    assert admitted(terms(anti=[term({"app": "web"})]), placed) == ["a2", "b1", "c1"]
    assert admitted(terms(anti=[term({"app": "web"}, ZONE)]), placed) == ["b1", "c1"]  # a1's zone, a2 with it
    assert admitted(terms(anti=[term({"app": "batch"})]), placed) == ["a1", "a2", "b1", "c1"]
    found = affinity_filter("ns/new", "ns", {}, terms(anti=[term({"app": "web"})]), placed, NODES)
    assert "pod ns/a1 in kubernetes.io/hostname=a1" in found.why_not(NODES["a1"])


def test_affinity_keeps_the_pod_to_the_domains_of_matching_pods_or_none_if_there_are_none() -> None:
    placed = [on("a1", {"app": "cache"})]
    assert admitted(terms(affinity=[term({"app": "cache"})]), placed) == ["a1"]
    assert admitted(terms(affinity=[term({"app": "cache"}, ZONE)]), placed) == ["a1", "a2"]
    unmet = affinity_filter("ns/new", "ns", {}, terms(affinity=[term({"app": "db"})]), placed, NODES)
    assert admitted(terms(affinity=[term({"app": "db"})]), placed) == []
    assert "no placed pod matches its pod affinity term" in unmet.unmet and "app In ['db']" in unmet.unmet
    # the first pod of a set that matches its own term may go anywhere (kube-scheduler's rule), as may one
    # whose term its gang's own pods match (they are placed with it)
    assert admitted(terms(affinity=[term({"app": "db"})]), placed, labels={"app": "db"}) == list(NODES)
    assert admitted(terms(affinity=[term({"app": "db"})]), placed, peers=(("ns", {"app": "db"}),)) == list(NODES)


def test_a_placed_pods_anti_affinity_keeps_matching_pods_out_of_its_domain() -> None:
    loner = on("b1", {"app": "loner"}, anti=[term({"team": "x"}, ZONE)])
    assert admitted((), [loner], labels={"team": "x"}) == ["a1", "a2", "c1"]
    assert admitted((), [loner], labels={"team": "y"}) == list(NODES)
    assert not affinity_filter("ns/new", "ns", {"team": "y"}, (), [loner], NODES).restricts  # nothing to tell
    assert admitted((), [loner], labels={"team": "x"}, namespace="other") == list(NODES)  # its own namespace only


def test_namespaces_a_term_selects() -> None:
    placed = [on("a1", {"app": "web"}, namespace="prod"), on("b1", {"app": "web"}, namespace="ns")]
    assert admitted(terms(anti=[term({"app": "web"})]), placed) == ["a1", "a2", "c1"]  # its own namespace
    assert admitted(terms(anti=[term({"app": "web"}, namespaces=["prod"])]), placed) == ["a2", "b1", "c1"]
    assert admitted(terms(anti=[term({"app": "web"}, namespaceSelector={})]), placed) == ["a2", "c1"]


def test_match_expressions_and_a_term_without_a_selector() -> None:
    placed = [on("a1", {"tier": "gpu"}), on("b1", {"tier": "cpu"}), on("c1", {})]
    expression = {"labelSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, "topologyKey": HOST}
    assert admitted(terms(anti=[expression]), placed) == ["a2", "c1"]
    not_in = {
        "labelSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]},
        "topologyKey": HOST,
    }
    assert admitted(terms(anti=[not_in]), placed) == ["a2", "b1"]  # c1's pod has no tier: NotIn selects it
    assert admitted(terms(anti=[{"topologyKey": HOST}]), placed) == list(NODES)  # no selector: selects no pod


def test_a_node_without_the_topology_key_is_in_no_domain() -> None:
    bare = node_named("bare")
    nodes = {**NODES, "bare": bare}
    placed = [Placed("ns/w", "ns", {"app": "web"}, "bare", ())]
    found = affinity_filter("ns/new", "ns", {}, terms(anti=[term({"app": "web"}, "rack")]), placed, nodes)
    assert not found.restricts and found.why_not(bare) == ""


def test_the_pod_itself_is_not_a_placed_pod() -> None:
    itself = Placed("ns/new", "ns", {"app": "web"}, "a1", ())
    assert admitted(terms(anti=[term({"app": "web"})]), [itself]) == list(NODES)


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        ({"podAntiAffinity": {REQ: [{"labelSelector": {}}]}}, f"podAntiAffinity.{REQ}[0].topologyKey", "required"),
        ({"podAffinity": {REQ: [term({}, namespaceSelector={"matchLabels": {"a": "b"}})]}}, "namespaceSelector", "not"),
        ({"podAffinity": {REQ: [term({}, matchLabelKeys=["app"])]}}, "matchLabelKeys", "not supported"),
        (
            {"podAffinity": {REQ: [{"topologyKey": HOST, "labelSelector": {"matchExpressions": [{"key": "k"}]}}]}},
            "matchExpressions[0].operator",
            "expected one of",
        ),
        (
            {
                "podAffinity": {
                    REQ: [
                        {"topologyKey": HOST, "labelSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}
                    ]
                }
            },
            "matchExpressions[0].values",
            "at least one value",
        ),
        ({"podAffinity": {REQ: "web"}}, f"podAffinity.{REQ}", "list of terms"),
        ({"podAffinity": {REQ: [term({}, namespaces="prod")]}}, "namespaces", "list"),
    ],
)
def test_a_bad_term_is_refused_naming_the_field(spec: dict[str, Any], field: str, says: str) -> None:
    with pytest.raises(PodSpecError) as raised:
        core.pod_affinity({"affinity": spec})
    assert field in str(raised.value) and says in str(raised.value), raised.value


def test_parse_pod_keeps_labels_and_terms_and_reports_a_bad_term_on_the_pod() -> None:
    from tests.binder.support import pod_object

    obj = pod_object("ns", "p", gpus=1)
    obj["metadata"]["labels"]["app"] = "web"
    obj["spec"]["affinity"] = {"podAntiAffinity": {REQ: [term({"app": "web"})]}}
    pod = core.parse_pod(obj)
    assert pod.labels["app"] == "web" and len(pod.affinity) == 1 and pod.affinity[0].anti
    obj["spec"]["affinity"] = {"podAntiAffinity": {REQ: [{"labelSelector": {}}]}}
    assert "topologyKey: required" in core.parse_pod(obj).invalid


def gang(*labels: dict[str, str], **kind: Any) -> list[tuple[str, dict[str, str], tuple[core.PodAffinityTerm, ...]]]:
    return [("ns", pod_labels, terms(**kind)) for pod_labels in labels]


def test_a_gangs_terms_on_its_own_pods_become_gang_constraints() -> None:
    worker = {"role": "worker"}
    assert gang(worker, worker, anti=[term(worker)]) == [("ns", worker, terms(anti=[term(worker)]))] * 2
    assert gang_affinity(gang(worker, worker, anti=[term(worker)])).distinct_nodes
    assert gang_affinity(gang(worker, worker, affinity=[term(worker)])).level == "node"
    assert gang_affinity(gang(worker, worker, affinity=[term(worker, ZONE)])).level == "rack"
    assert gang_affinity(gang(worker, worker, anti=[term({"app": "web"})])) == core.GangAffinity()  # not its own
    assert gang_affinity(gang(worker, anti=[term(worker)])) == core.GangAffinity()  # a pod alone: no peers


def test_a_gangs_terms_placement_cannot_express_are_refused_naming_the_term() -> None:
    worker = {"role": "worker"}
    zone_spread = gang_affinity(gang(worker, worker, anti=[term(worker, ZONE)]))
    assert "podAntiAffinity" in zone_spread.refusal and ZONE in zone_spread.refusal
    both = gang_affinity(gang(worker, worker, anti=[term(worker)], affinity=[term(worker)]))
    assert "one node" in both.refusal


def test_gang_topology_takes_the_stricter() -> None:
    shared = core.GangAffinity(level="node")
    assert gang_topology(Topology(), shared) == Topology("node", True)
    assert gang_topology(Topology("rack", True), shared) == Topology("node", True)
    assert gang_topology(Topology("nvlink_island", True), shared) == Topology("nvlink_island", True)
    assert gang_topology(Topology("rack", False), core.GangAffinity()) == Topology("rack", False)


def test_another_schedulers_pod_is_placed_while_bound_and_not_ended() -> None:
    obj: dict[str, Any] = {
        "metadata": {"name": "legacy", "namespace": "ns", "labels": {"app": "cache"}},
        "spec": {"nodeName": "a1", "affinity": {"podAntiAffinity": {REQ: [term({"team": "noisy"})]}}},
        "status": {"phase": "Running"},
    }
    placed = core.placed_pod(obj)
    assert placed is not None and (placed.name, placed.node, dict(placed.labels)) == (
        "ns/legacy",
        "a1",
        {"app": "cache"},
    )
    assert len(placed.terms) == 1 and placed.terms[0].anti  # its anti-affinity keeps noisy pods away (symmetry)
    assert core.placed_pod({**obj, "status": {"phase": "Succeeded"}}) is None
    assert core.placed_pod({**obj, "spec": {}}) is None
    unreadable = {**obj, "spec": {"nodeName": "a1", "affinity": {"podAntiAffinity": {REQ: [{"labelSelector": {}}]}}}}
    assert core.placed_pod(unreadable) is not None and core.placed_pod(unreadable).terms == ()  # type: ignore[union-attr]


def test_the_spread_replicas_example_is_read_as_written() -> None:
    """docs/examples/spread-replicas.yaml: its pod template parses with its terms and constraint, and once one
    replica and a cache are placed, the next replica keeps to the cache's zone and off the first one's node."""
    import yaml

    from tests.conftest import REPO_ROOT

    manifest = yaml.safe_load((REPO_ROOT / "docs" / "examples" / "spread-replicas.yaml").read_text())
    template = manifest["spec"]["template"]
    labels = {**template["metadata"]["labels"], "pod-template-hash": "5d9f"}  # as the ReplicaSet adds it
    obj = {"metadata": {"name": "llm-serve-1", "namespace": "inference", "labels": labels}, "spec": template["spec"]}
    pod = core.parse_pod(obj)
    assert not pod.invalid and len(pod.affinity) == 2 and len(pod.spread) == 1
    assert pod.spread[0].selects(labels) and not pod.spread[0].selects({**labels, "pod-template-hash": "old"})
    placed = [
        Placed("inference/cache", "inference", {"app": "model-cache"}, "a1", ()),
        Placed("inference/llm-serve-0", "inference", labels, "a2", pod.affinity),
    ]
    found = core.pod_filter(pod, placed, NODES)
    # the cache's zone is za (a1, a2); a2 holds a replica; the spread lets za take a second replica only while
    # no zone is emptier by more than one, and zb and zc are at 0: za is at 1, so 1 + 1 - 0 > 1 bars it too
    assert sorted(name for name, node in NODES.items() if not found.why_not(node)) == []
    placed.append(Placed("inference/llm-serve-2", "inference", labels, "b1", pod.affinity))
    placed.append(Placed("inference/llm-serve-3", "inference", labels, "c1", pod.affinity))
    found = core.pod_filter(pod, placed, NODES)
    assert sorted(name for name, node in NODES.items() if not found.why_not(node)) == ["a1"]
