"""Nodes from the API, their NodeState record merged with telemetry's, GPU model names."""

from __future__ import annotations

from kumiki.binder import core
from kumiki.common.contracts.v1 import events_pb2
from tests.binder.support import node_object, pod_object


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
