"""kumiki.binder.adapters.convert: a Node's NodeState record (merged with telemetry's), when two records differ
enough to republish, and a gang's outcome as the JobState of its Release."""

from __future__ import annotations

from typing import Any

from kumiki.binder import core
from kumiki.binder.adapters import convert
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
