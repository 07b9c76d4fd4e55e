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


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("3600", 3600.0),
        ("5400.5", 5400.5),
        (" 45 ", 45.0),
        ("90s", 90.0),
        ("90m", 5400.0),
        ("2h", 7200.0),
        ("1h30m", 5400.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("0h30m", 1800.0),
    ],
)
def test_durations_in_seconds_or_number_and_unit_parts(text: str, seconds: float) -> None:
    assert core.parse_duration_s(text, "where") == seconds


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("0", "must be a positive, finite time, got '0'"),
        ("0s", "must be a positive, finite time, got '0s'"),
        ("-5", "must be a positive, finite time, got '-5'"),
        ("1" + "0" * 400, "must be a positive, finite time"),  # inf as a float
        ("abc", "expected seconds or a duration such as 90m, 1h30m, 1d, got 'abc'"),
        ("5x", "expected seconds or a duration such as 90m, 1h30m, 1d, got '5x'"),
        ("", "got ''"),
        ("h", "got 'h'"),
        ("1h 30m", "got '1h 30m'"),
        ("inf", "got 'inf'"),
        ("nan", "got 'nan'"),
        ("1e3", "got '1e3'"),
        ("-5m", "got '-5m'"),
        ("\u0663", "got"),  # a non-ASCII digit float() would take
    ],
)
def test_a_bad_duration_names_the_field_and_the_text(text: str, problem: str) -> None:
    with pytest.raises(core.PodSpecError) as raised:
        core.parse_duration_s(text, "where")
    assert str(raised.value).startswith("where: ") and problem in str(raised.value)


def time_limited(annotation: str | None = None, deadline: object = None) -> core.Pod:
    obj = pod_object("ns", "t", gpus=1)
    if annotation is not None:
        obj["metadata"]["annotations"][core.TIME_LIMIT_ANNOTATION] = annotation
    if deadline is not None:
        obj["spec"]["activeDeadlineSeconds"] = deadline
    return core.parse_pod(obj)


@pytest.mark.parametrize(
    ("annotation", "deadline", "seconds"),
    [
        (None, None, None),
        ("3600", None, 3600.0),
        ("90m", None, 5400.0),
        ("1h30m", None, 5400.0),
        ("1d", None, 86400.0),
        (None, 7200, 7200.0),
        ("1h", 7200, 3600.0),  # both: the smaller
        ("1d", 600, 600.0),
    ],
)
def test_the_time_limit_from_the_annotation_or_the_active_deadline_the_smaller_wins(
    annotation: str | None, deadline: int | None, seconds: float | None
) -> None:
    pod = time_limited(annotation, deadline)
    assert pod.invalid == "" and pod.resources is not None
    assert pod.time_limit_s == seconds


@pytest.mark.parametrize(
    ("annotation", "deadline", "problem"),
    [
        ("0", None, "kumiki.io/time-limit: must be a positive, finite time, got '0'"),
        ("-60", None, "kumiki.io/time-limit: must be a positive, finite time, got '-60'"),
        ("abc", None, "kumiki.io/time-limit: expected seconds or a duration such as 90m, 1h30m, 1d, got 'abc'"),
        ("5x", None, "kumiki.io/time-limit: expected seconds or a duration such as 90m, 1h30m, 1d, got '5x'"),
        ("5x", 600, "kumiki.io/time-limit: expected seconds"),  # a valid deadline does not hide a bad annotation
        (None, 0, "spec.activeDeadlineSeconds: must be a whole number of seconds from 1 to 2**63 - 1, got 0"),
        (None, -5, "spec.activeDeadlineSeconds: must be a whole number of seconds from 1 to 2**63 - 1, got -5"),
        (None, 1.5, "spec.activeDeadlineSeconds: must be a whole number of seconds from 1 to 2**63 - 1, got 1.5"),
        (None, "600", "spec.activeDeadlineSeconds: must be a whole number of seconds from 1 to 2**63 - 1, got '600'"),
        (None, True, "spec.activeDeadlineSeconds: must be a whole number of seconds from 1 to 2**63 - 1, got True"),
        (None, 2**63, "spec.activeDeadlineSeconds: must be a whole number of seconds"),
        ("1h", 1.5, "spec.activeDeadlineSeconds: "),
    ],
)
def test_a_bad_time_limit_makes_the_pod_invalid_naming_the_field(
    annotation: str | None, deadline: object, problem: str
) -> None:
    pod = time_limited(annotation, deadline)
    assert pod.resources is None and pod.time_limit_s is None
    assert problem in pod.invalid
