"""Taints and tolerations, nodeSelector, required node affinity, and the node lists Placement gets."""

from __future__ import annotations

from kumiki.binder import core
from kumiki.sched.jobs import PodRequest
from tests.binder.core.support import node_named
from tests.binder.support import pod_object


def _rules(spec: dict) -> core.NodeRules:  # type: ignore[type-arg]
    return core.node_rules(spec)


def test_taints_block_unless_tolerated_and_prefer_no_schedule_never_blocks() -> None:
    reserved = node_named("r", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])
    soft = node_named("s", taints=[{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}])
    evicting = node_named("e", taints=[{"key": "maintenance", "effect": "NoExecute"}])
    plain = _rules({})
    assert plain.why_not(reserved) == "node(s) had untolerated taint {dedicated: infer}"
    assert plain.admits(soft) and not plain.admits(evicting)
    equal = _rules(
        {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}]}
    )
    assert equal.admits(reserved) and not equal.admits(evicting)
    assert not _rules({"tolerations": [{"key": "dedicated", "value": "train"}]}).admits(reserved)
    assert not _rules({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]}).admits(
        reserved
    )
    everything = _rules({"tolerations": [{"operator": "Exists"}]})
    assert everything.admits(reserved) and everything.admits(evicting)


def test_node_selector_and_required_affinity_operators() -> None:
    z1 = node_named("a1", {"zone": "z1", "gen": "3"})
    z2 = node_named("a2", {"zone": "z2", "gen": "5"})
    bare = node_named("b")
    assert _rules({"nodeSelector": {"zone": "z1"}}).admits(z1)
    assert not _rules({"nodeSelector": {"zone": "z1"}}).admits(z2)

    def affinity(*terms: list[dict]) -> core.NodeRules:  # type: ignore[type-arg]
        term_list = [{"matchExpressions": term} for term in terms]
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": term_list}}
        return _rules({"affinity": {"nodeAffinity": required}})

    in_z2 = affinity([{"key": "zone", "operator": "In", "values": ["z2"]}])
    assert [in_z2.admits(n) for n in (z1, z2, bare)] == [False, True, False]
    not_z2 = affinity([{"key": "zone", "operator": "NotIn", "values": ["z2"]}])
    assert [not_z2.admits(n) for n in (z1, z2, bare)] == [True, False, True]
    exists = affinity([{"key": "zone", "operator": "Exists"}])
    assert [exists.admits(n) for n in (z1, z2, bare)] == [True, True, False]
    absent = affinity([{"key": "zone", "operator": "DoesNotExist"}])
    assert [absent.admits(n) for n in (z1, z2, bare)] == [False, False, True]
    newer = affinity([{"key": "gen", "operator": "Gt", "values": ["4"]}])
    assert [newer.admits(n) for n in (z1, z2, bare)] == [False, True, False]
    either = affinity(
        [{"key": "zone", "operator": "In", "values": ["z1"]}], [{"key": "gen", "operator": "Gt", "values": ["4"]}]
    )
    assert [either.admits(n) for n in (z1, z2, bare)] == [True, True, False]  # terms OR, expressions AND
    both = affinity([{"key": "zone", "operator": "Exists"}, {"key": "gen", "operator": "Lt", "values": ["4"]}])
    assert [both.admits(n) for n in (z1, z2, bare)] == [True, False, False]
    by_name = _rules(
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a2"]}]}
                        ]
                    }
                }
            }
        }
    )
    assert [by_name.admits(n) for n in (z1, z2, bare)] == [False, True, False]


def test_invalid_node_rules_name_the_field() -> None:
    obj = pod_object("ns", "p", gpus=1)
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["z1"]}]}]
            }
        }
    }
    pod = core.parse_pod(obj)
    assert pod.resources is None
    assert pod.invalid.startswith(
        f"spec.affinity.nodeAffinity.{core.REQUIRED_AFFINITY}.nodeSelectorTerms[0].matchExpressions[0].operator: "
        "expected one of"
    )


def test_node_choice_tells_placement_the_shorter_list_or_why_none() -> None:
    nodes = [node_named(f"n{i}", {"zone": "z1" if i < 3 else "z2"}) for i in range(10)]
    tainted = [*nodes, node_named("t", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])]
    assert core.node_choice(core.NodeRules(), nodes, tainted=False) == core.NodeChoice()
    few = core.node_choice(_rules({"nodeSelector": {"zone": "z1"}}), nodes, tainted=False)
    assert few == core.NodeChoice(nodes=("n0", "n1", "n2"))
    most = core.node_choice(_rules({"nodeSelector": {"zone": "z2"}}), nodes, tainted=False)
    assert most == core.NodeChoice(avoid=("n0", "n1", "n2"))
    assert core.node_choice(core.NodeRules(), tainted, tainted=True) == core.NodeChoice(avoid=("t",))
    nowhere = core.node_choice(_rules({"nodeSelector": {"zone": "z9"}}), nodes, tainted=False)
    assert nowhere.none_because == "0/10 nodes admit it: node(s) didn't match Pod's node affinity/selector"
    # the GPU model selector is Placement's gpu_model, not a node list
    model = core.parse_pod(
        {**pod_object("ns", "m", gpus=1)}
        | {
            "spec": {
                **pod_object("ns", "m", gpus=1)["spec"],
                "nodeSelector": {core.GPU_MODEL_SELECTOR: "NVIDIA-A100-SXM4-80GB"},
            }
        }
    )
    assert not model.rules.restricts and model.resources is not None and model.resources.gpu_model == "A100-80GB"
    request = core.with_choice(PodRequest(gpus=1), few)
    assert request.nodes == {"n0", "n1", "n2"} and not request.avoid_nodes
    assert core.same_requests([request], [PodRequest(gpus=1)])
    assert not core.same_requests([request], [PodRequest(gpus=2)])
