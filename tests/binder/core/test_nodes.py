"""Nodes from the API (their NodeState record is tests/binder/adapters/test_convert.py), GPU model names."""

from __future__ import annotations

from kumiki.binder import core
from tests.binder.support import node_object, pod_object


def test_node_from_the_api() -> None:
    obj = node_object("n1", 8, island=4, rack="r7")
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node = core.parse_node(obj)
    assert (node.gpus, node.island_size, node.rack, node.schedulable) == (8, 4, "r7", True)
    assert node.gpu_uuids[3] == "GPU-n1-3"
    obj["spec"]["unschedulable"] = True
    cordoned = core.parse_node(obj)
    assert not cordoned.schedulable and "cordoned" in cordoned.why_not
    mig = core.parse_node(node_object("n2", 8, mig=True))
    assert mig.mig and mig.gpus == 8


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
