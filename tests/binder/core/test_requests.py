"""What a pod asks for: MIG slices and GPU fractions; invalid requests name the field."""

from __future__ import annotations

import pytest

from kumiki.binder import core
from tests.binder.support import pod_object


def test_mig_and_fraction_requests() -> None:
    mig = core.parse_pod(pod_object("ns", "m", mig="1g.10gb"))
    assert mig.resources is not None and mig.resources.mig_profile == "1g.10gb" and mig.resources.gpus == 0
    share = core.parse_pod(pod_object("ns", "f", fraction=0.25, gpu_memory="20Gi"))
    assert share.resources is not None
    assert share.resources.gpu_fraction == 0.25 and share.resources.gpu_memory_gb == 20.0


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


@pytest.mark.parametrize(
    ("resource", "value", "problem"),
    [
        ("cpu", "1e30", "resources[cpu]: at most 2**53 millicores"),
        ("memory", "1e30", "resources[memory]: at most 2**53 MiB"),
        ("memory", "20000000000000000Ei", "resources[memory]: at most 2**53 MiB"),
        (core.GPU_MEMORY_ANNOTATION, "99999999999999999999999", "kumiki.io/gpu-memory: at most 2**53 MiB"),
        (core.GPU_RESOURCE, "1e20", "resources[nvidia.com/gpu]: at most 64 GPUs per pod"),
    ],
)
def test_a_request_past_what_placement_holds_is_invalid_not_a_crash(resource: str, value: str, problem: str) -> None:
    """Past 2**64 the protobuf field raised a plain ValueError out of parse_pod (the watch dropped the pod
    untold; at start it stopped the binder syncing); now the pod is kept, invalid, and told which field."""
    if resource == core.GPU_MEMORY_ANNOTATION:
        obj = pod_object("ns", "big", fraction=0.5, gpu_memory="1Gi")
        obj["metadata"]["annotations"][resource] = value
    else:
        obj = pod_object("ns", "big", gpus=1)
        obj["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})[resource] = value
    pod = core.parse_pod(obj)
    assert pod.resources is None and problem in pod.invalid
    at_bound = pod_object("ns", "edge", gpus=1)
    at_bound["spec"]["containers"][0].setdefault("resources", {}).setdefault("requests", {})["cpu"] = str(2**53 // 1000)
    edge = core.parse_pod(at_bound)
    assert edge.resources is not None and edge.resources.cpu_milli == 2**53 // 1000 * 1000


def test_topology_annotations_become_the_scheduling_cores_levels() -> None:
    def topology(annotations: dict[str, str]) -> core.Topology:
        obj = pod_object("ns", "t", gpus=1)
        obj["metadata"].setdefault("annotations", {}).update(annotations)
        return core.parse_pod(obj).topology

    assert topology({}) == core.Topology()
    assert topology({core.TOPOLOGY_ANNOTATION: "nvlink-island", core.TOPOLOGY_REQUIRED_ANNOTATION: "true"}) == (
        core.Topology("nvlink_island", required=True)
    )
    assert topology({core.TOPOLOGY_ANNOTATION: "rack"}) == core.Topology("rack", required=False)
