"""kumiki.binder.adapters.convert: a Node's NodeState record (merged with telemetry's), when two records differ
enough to republish, and a gang's outcome as the JobState of its Release."""

from __future__ import annotations

from typing import Any

from kumiki.binder import core
from kumiki.binder.adapters import convert
from kumiki.common import requests
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from tests.binder.support import node_object, pod_object


def ready(name: str, island: int = 4, rack: str = "rack-0") -> dict[str, Any]:
    obj = node_object(name, 8, island=island, rack=rack)
    obj["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return obj


def test_node_record_from_the_api_inventory() -> None:
    node = core.parse_node(ready("n1", island=4, rack="r7"))
    state = convert.node_state(node)
    assert [gpu.nvlink_island for gpu in state.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert state.gpus[3].uuid == "GPU-n1-3" and state.healthy
    assert (state.node, state.rack, state.version.version) == ("n1", "r7", node.version)
    assert state.labels["kumiki.io/source"] == "kubernetes"
    obj = ready("n1")
    obj["spec"]["unschedulable"] = True
    assert not convert.node_state(core.parse_node(obj)).healthy


def test_telemetry_unhealthy_wins_and_an_api_cordon_wins_over_telemetry() -> None:
    node = core.parse_node(ready("n1"))
    sick = events_pb2.NodeState(
        node="n1", healthy=False, rack="r-telemetry", gpus=[events_pb2.GpuState(index=0, uuid="GPU-real", healthy=True)]
    )
    merged = convert.node_state(node, sick)
    assert not merged.healthy and [gpu.uuid for gpu in merged.gpus] == ["GPU-real"]
    assert merged.rack == "r-telemetry"
    sick.gpus[0].uuid = "changed"  # the record holds copies, not telemetry's messages
    assert merged.gpus[0].uuid == "GPU-real"
    well = events_pb2.NodeState(node="n1", healthy=True)
    assert convert.node_state(node, well).healthy and len(convert.node_state(node, well).gpus) == 8
    obj = ready("n1")
    obj["spec"]["unschedulable"] = True
    assert not convert.node_state(core.parse_node(obj), well).healthy


def test_a_new_version_or_observation_alone_is_the_same_record() -> None:
    node = core.parse_node(ready("n1"))
    first = convert.node_state(node)
    again = convert.node_state(node)
    again.version.CopyFrom(common_pb2.EntityVersion(version=first.version.version + 5))
    again.last_seen.seconds = 1234
    assert convert.same_node_state(first, again)
    assert again.last_seen.seconds == 1234 and again.HasField("version")  # the arguments are left as they were
    cordoned = convert.node_state(node)
    cordoned.healthy = False
    assert not convert.same_node_state(first, cordoned)


def test_gang_outcome_as_the_job_state_of_its_release() -> None:
    def pod(name: str, phase: str) -> core.Pod:
        obj = pod_object("ns", name, gpus=1, group="g")
        obj["spec"]["nodeName"] = "n"
        obj["status"] = {"phase": phase}
        return core.parse_pod(obj)

    def state(*phases: str) -> int:
        return convert.job_state(core.gang_outcome([pod(f"p{i}", phase) for i, phase in enumerate(phases)]))

    assert state("Succeeded", "Succeeded") == events_pb2.JOB_STATE_COMPLETED
    assert state("Succeeded", "Failed") == events_pb2.JOB_STATE_FAILED
    assert state("Failed", "Running") == events_pb2.JOB_STATE_UNSPECIFIED
    assert state() == events_pb2.JOB_STATE_UNSPECIFIED


def _set_fields(messages: list[Any]) -> set[str]:
    return {descriptor.name for message in messages for descriptor, _ in message.ListFields()}


def test_pod_resources_round_trip_through_the_cores_pod_request() -> None:
    samples = [
        common_pb2.PodResources(
            gpus=8,
            gpu_memory_mib=81920,
            cpu_milli=16000,
            memory_mib=65536,
            gpu_model="A100-80GB",
            nodes=["n1", "n2"],
            avoid_nodes=["n3"],
        ),
        common_pb2.PodResources(mig_profile="1g.10gb", cpu_milli=500, memory_mib=1024),
        common_pb2.PodResources(gpu_fraction=0.3, gpu_memory_mib=12345, node_preference={"n1": 300, "n2": -200}),
    ]
    # every field is set in some sample: one the conversion dropped would fail the round trip
    assert _set_fields(samples) == {field.name for field in common_pb2.PodResources.DESCRIPTOR.fields}
    for message in samples:
        request = convert.pod_request(message)
        assert request is not None
        assert requests.pod_resources(request) == message


def test_gpu_memory_is_exact_in_whole_mib_both_ways() -> None:
    for mib in (1, 1023, 1025, 12345, 20480, 2**40 + 1, 2**53 - 1, 2**53):
        message = common_pb2.PodResources(gpu_fraction=0.5, gpu_memory_mib=mib)
        request = convert.pod_request(message)
        assert request is not None and requests.pod_resources(request).gpu_memory_mib == mib
    share = core.parse_pod(pod_object("ns", "f", fraction=0.25, gpu_memory="20Gi"))
    assert share.resources is not None
    wire = requests.pod_resources(share.resources)
    assert (wire.gpu_fraction, wire.gpu_memory_mib) == (0.25, 20480)
    odd = pod_object("ns", "o", fraction=0.5, gpu_memory="12345")
    parsed = core.parse_pod(odd).resources
    assert parsed is not None and requests.pod_resources(parsed).gpu_memory_mib == 12345


def test_a_pod_parsed_from_the_api_reads_back_the_same_from_the_wire() -> None:
    for obj in (
        pod_object("ns", "w", gpus=4, cpu="1500m", memory="2Gi"),
        pod_object("ns", "m", mig="3g.40gb"),
        pod_object("ns", "f", fraction=0.125, gpu_memory="10Gi"),
    ):
        pod = core.parse_pod(obj)
        assert pod.resources is not None
        request = core.with_choice(pod.resources, core.NodeChoice(avoid=("n9", "n1")))
        message = requests.pod_resources(request)
        assert list(message.avoid_nodes) == ["n1", "n9"]
        assert convert.pod_request(message) == request
        assert core.same_requests([convert.pod_request(message)], [pod.resources])


def test_a_logged_request_that_is_not_one_reads_as_none() -> None:
    assert convert.pod_request(common_pb2.PodResources(gpus=2, mig_profile="1g.10gb")) is None
    assert not core.same_requests([convert.pod_request(common_pb2.PodResources(gpus=1, gpu_fraction=0.5))], [None])


def test_topology_round_trip_for_every_wire_level() -> None:
    for level in common_pb2.TopologyLevel.values():
        for required in (False, True):
            message = common_pb2.TopologyConstraint(level=level, required=required)
            assert convert.topology_constraint(convert.topology(message)) == message
    assert convert.topology_constraint(core.Topology()) == common_pb2.TopologyConstraint()
    obj = pod_object("ns", "t", gpus=1)
    obj["metadata"]["annotations"] = {
        core.TOPOLOGY_ANNOTATION: "nvlink-island",
        core.TOPOLOGY_REQUIRED_ANNOTATION: "true",
    }
    assert convert.topology_constraint(core.parse_pod(obj).topology) == common_pb2.TopologyConstraint(
        level=common_pb2.TOPOLOGY_LEVEL_NVLINK_ISLAND, required=True
    )


def _same_fields(message: Any, value: Any) -> None:
    """Every field of the message, set, reads the same on the core value (a dropped field fails)."""
    names = {field.name for field in message.DESCRIPTOR.fields}
    assert _set_fields([message]) == names
    for name in names:
        wire = getattr(message, name)
        assert getattr(value, name) == (tuple(wire) if not isinstance(wire, str | int | float) else wire), name


def test_placements_answers_keep_every_field() -> None:
    assignment = common_pb2.PodAssignment(
        pod_index=3, node="n7", gpu_indices=[4, 5], mig_slice="1g.10gb@2", gpu_fraction=0.5
    )
    _same_fields(assignment, convert.pod_assignment(assignment))
    assert convert.pod_assignments([assignment, assignment]) == [convert.pod_assignment(assignment)] * 2
    reason = common_pb2.PendingReason(
        code="insufficient_gpus", resource="gpus", node_shape="8x A100-80GB", message="needs 8 free GPUs"
    )
    _same_fields(reason, convert.pending_reason(reason))
    assert core.reason_text([convert.pending_reason(reason)], 2) == (
        "Unschedulable",
        "needs 8 free GPUs; position 2 in its queue",
    )
