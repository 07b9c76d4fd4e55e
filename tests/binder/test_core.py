"""The binder's pure core: requests read the way users write them, nodes, reasons, never-fits."""

from __future__ import annotations

import pytest

from kumiki.binder import core
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from tests.binder.support import node_object, pod_object


def test_quantities() -> None:
    assert core.quantity("500m", "x") == 0.5
    assert core.quantity("2", "x") == 2
    assert core.quantity("1Gi", "x") == 2**30
    assert core.quantity("1.5G", "x") == 1.5e9
    with pytest.raises(core.PodSpecError, match="x: not a quantity"):
        core.quantity("lots", "x")


def test_whole_gpus_cpu_and_memory_and_the_gang_label() -> None:
    pod = core.parse_pod(pod_object("ns", "p", gpus=4, cpu="1500m", memory="2Gi", group="g"))
    assert pod.invalid == ""
    assert pod.resources == common_pb2.PodResources(gpus=4, cpu_milli=1500, memory_mib=2048)
    assert pod.job_id == "ns/g" and pod.queue == "ns"
    alone = core.parse_pod(pod_object("ns", "solo", gpus=1, labels={core.QUEUE_LABEL: "team-a"}))
    assert alone.job_id == "ns/pod/solo" and alone.queue == "team-a"


def test_mig_and_fraction_requests() -> None:
    mig = core.parse_pod(pod_object("ns", "m", mig="1g.10gb"))
    assert mig.resources is not None and mig.resources.mig_profile == "1g.10gb" and mig.resources.gpus == 0
    share = core.parse_pod(pod_object("ns", "f", fraction=0.25, gpu_memory="20Gi"))
    assert share.resources is not None
    assert share.resources.gpu_fraction == 0.25 and share.resources.gpu_memory_mib == 20480


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"annotations": {core.GPU_FRACTION_ANNOTATION: "1.5", core.GPU_MEMORY_ANNOTATION: "1Gi"}}, "within (0, 1)"),
        ({"annotations": {core.GPU_FRACTION_ANNOTATION: "0.5"}}, "kumiki.io/gpu-memory: required"),
        ({"annotations": {core.TOPOLOGY_ANNOTATION: "galaxy"}}, "kumiki.io/topology: expected one of"),
        (
            {"gpus": 2, "annotations": {core.GPU_FRACTION_ANNOTATION: "0.5", core.GPU_MEMORY_ANNOTATION: "1Gi"}},
            "only one of",
        ),
    ],
)
def test_invalid_requests_name_the_field(changes: dict, problem: str) -> None:  # type: ignore[type-arg]
    obj = pod_object("ns", "bad", gpus=changes.get("gpus", 0))
    obj["metadata"]["annotations"].update(changes["annotations"])
    pod = core.parse_pod(obj)
    assert pod.resources is None and problem in pod.invalid


def test_node_from_the_api_and_its_record() -> None:
    obj = node_object("n1", 8, island=4, rack="r7")
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node = core.parse_node(obj)
    assert (node.gpus, node.island_size, node.rack, node.schedulable) == (8, 4, "r7", True)
    state = core.node_state(node)
    assert [gpu.nvlink_island for gpu in state.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert state.gpus[3].uuid == "GPU-n1-3" and state.healthy
    obj["spec"]["unschedulable"] = True
    cordoned = core.parse_node(obj)
    assert not cordoned.schedulable and "cordoned" in cordoned.why_not
    assert not core.node_state(cordoned).healthy
    mig = core.parse_node(node_object("n2", 8, mig=True))
    assert mig.mig and mig.gpus == 8


def test_telemetry_unhealthy_wins_and_an_api_cordon_wins_over_telemetry() -> None:
    obj = node_object("n1", 8)
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node = core.parse_node(obj)
    sick = events_pb2.NodeState(
        node="n1", healthy=False, gpus=[events_pb2.GpuState(index=0, uuid="GPU-real", healthy=True)]
    )
    merged = core.node_state(node, sick)
    assert not merged.healthy and merged.gpus[0].uuid == "GPU-real"
    well = events_pb2.NodeState(node="n1", healthy=True)
    obj["spec"]["unschedulable"] = True
    assert not core.node_state(core.parse_node(obj), well).healthy


def test_never_fits_says_why() -> None:
    nodes = [core.parse_node(node_object("n1", 8))]
    assert "largest node has 8" in core.never_fits(common_pb2.PodResources(gpus=16), nodes)
    assert "no node is in MIG mode" in core.never_fits(common_pb2.PodResources(mig_profile="1g.10gb"), nodes)
    assert core.never_fits(common_pb2.PodResources(gpus=8), nodes) == ""


def test_assignment_annotations_carry_uuids_slices_and_fractions() -> None:
    node = core.parse_node(node_object("n1", 8))
    whole = core.assignment_annotations("ns/g", 2, common_pb2.PodAssignment(node="n1", gpu_indices=[2, 3]), node)
    assert whole[core.GPU_UUIDS_ANNOTATION] == "GPU-n1-2,GPU-n1-3" and whole[core.GENERATION_ANNOTATION] == "2"
    mig = core.assignment_annotations(
        "ns/m", 1, common_pb2.PodAssignment(node="n1", gpu_indices=[5], mig_slice="1g.10gb@3"), node
    )
    assert mig[core.MIG_SLICE_ANNOTATION] == "1g.10gb@3"
    share = core.assignment_annotations(
        "ns/f", 1, common_pb2.PodAssignment(node="n1", gpu_indices=[1], gpu_fraction=0.5), node
    )
    assert share[core.GPU_FRACTION_ANNOTATION] == "0.5"


def test_gang_outcomes_and_readiness() -> None:
    def pod(name: str, phase: str, node: str = "n") -> core.Pod:
        obj = pod_object("ns", name, gpus=1, group="g")
        obj["spec"]["nodeName"] = node
        obj["status"] = {"phase": phase}
        return core.parse_pod(obj)

    assert core.gang_outcome([pod("a", "Succeeded"), pod("b", "Succeeded")]) == events_pb2.JOB_STATE_COMPLETED
    assert core.gang_outcome([pod("a", "Succeeded"), pod("b", "Failed")]) == events_pb2.JOB_STATE_FAILED
    assert core.gang_outcome([pod("a", "Succeeded"), pod("b", "Running")]) == events_pb2.JOB_STATE_UNSPECIFIED
    gang = core.Gang(job_id="ns/g", namespace="ns", group="g", min_member=3)
    for name in ("a", "b"):
        waiting = pod(name, "Pending", node="")
        gang.pods[waiting.key] = waiting
    assert not gang.ready_to_submit()
    third = pod("c", "Pending", node="")
    gang.pods[third.key] = third
    assert gang.ready_to_submit()
    assert core.bind_request_fields(gang, gang.waiting())["min_members"] == 3


def test_gpu_feature_discovery_product_labels_become_kumiki_model_names() -> None:
    assert core.gpu_model_name("NVIDIA-A100-SXM4-80GB") == "A100-80GB"
    assert core.gpu_model_name("NVIDIA-H100-80GB-HBM3") == "H100-80GB"
    assert core.gpu_model_name("Tesla-V100-SXM2-32GB") == "V100-32GB"
    assert core.gpu_model_name("NVIDIA-L4", 23034) == "L4-22GB"
    node = core.parse_node(node_object("n1", 8, mig=True))
    assert node.gpu_model == "A100-80GB"  # a model placement knows the MIG profiles of
    pod = core.parse_pod(
        {
            **pod_object("ns", "p", gpus=1),
            "spec": {
                **pod_object("ns", "p", gpus=1)["spec"],
                "nodeSelector": {core.GPU_MODEL_SELECTOR: "NVIDIA-A100-SXM4-80GB"},
            },
        }
    )
    assert pod.resources is not None and pod.resources.gpu_model == "A100-80GB"


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-12-01T18:00:05Z", 1796148005.0),
        ("2026-12-01T18:00:05+00:00", 1796148005.0),
        ("", 0.0),  # absent: bound all the same, left out of the latency histogram
        ("yesterday", 0.0),
        ("2026-12-01T18:00:05", 0.0),  # no zone: not a time the API server writes
        (1796148005, 0.0),
    ],
)
def test_creation_timestamp_for_the_pod_scheduling_latency(stamp: object, expected: float) -> None:
    obj = pod_object("ns", "p", gpus=1)
    obj["metadata"]["creationTimestamp"] = stamp
    assert core.parse_pod(obj).created_unix_s == expected


def _node(name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None) -> core.Node:
    obj = node_object(name)
    obj["metadata"]["labels"].update(labels or {})
    if taints:
        obj["spec"]["taints"] = taints
    return core.parse_node(obj)


def _rules(spec: dict) -> core.NodeRules:  # type: ignore[type-arg]
    return core.node_rules(spec)


def test_taints_block_unless_tolerated_and_prefer_no_schedule_never_blocks() -> None:
    reserved = _node("r", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}])
    soft = _node("s", taints=[{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}])
    evicting = _node("e", taints=[{"key": "maintenance", "effect": "NoExecute"}])
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
    z1 = _node("a1", {"zone": "z1", "gen": "3"})
    z2 = _node("a2", {"zone": "z2", "gen": "5"})
    bare = _node("b")
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
    nodes = [_node(f"n{i}", {"zone": "z1" if i < 3 else "z2"}) for i in range(10)]
    tainted = [*nodes, _node("t", taints=[{"key": "gpu", "value": "reserved", "effect": "NoSchedule"}])]
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
    request = core.with_choice(common_pb2.PodResources(gpus=1), few)
    assert list(request.nodes) == ["n0", "n1", "n2"]
    assert core.same_requests([request], [common_pb2.PodResources(gpus=1)])
    assert not core.same_requests([request], [common_pb2.PodResources(gpus=2)])


def test_cluster_capacity_never_fits_and_changes() -> None:
    nodes = [_node("a"), _node("b")]
    capacity = core.ClusterCapacity.of(nodes)
    assert capacity.never_fits(common_pb2.PodResources(gpus=8)) == ""
    assert capacity.never_fits(common_pb2.PodResources(gpus=9)) == "asks for 9 GPUs; the largest node has 8"
    assert not capacity.tainted
    assert core.ClusterCapacity.of([]).never_fits(common_pb2.PodResources(gpus=1)) == "no nodes in the cluster"
    heartbeat = _node("a")
    assert not core.capacity_changed(nodes[0], heartbeat)
    assert core.capacity_changed(nodes[0], _node("a", taints=[{"key": "k", "effect": "NoSchedule"}]))
