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
