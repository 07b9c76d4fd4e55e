"""The one wire encoding of a pod's request: every field survives a round trip, and a bad field is named."""

from __future__ import annotations

import pytest

from kumiki.common import requests
from kumiki.common.contracts.v1 import common_pb2
from kumiki.common.grpcutil import InvalidRequest
from kumiki.sched.jobs import PodRequest


@pytest.mark.parametrize(
    "request_",
    [
        PodRequest(gpus=4, cpu_milli=8000, memory_mib=65536, gpu_model="H100-80GB"),
        PodRequest(gpu_fraction=0.25, gpu_memory_gb=12.5, nodes=frozenset({"b", "a"})),
        PodRequest(mig_profile="1g.10gb", avoid_nodes=frozenset({"n3"})),
        PodRequest(gpus=1, node_preference=(("a", -300), ("b", 200))),
    ],
)
def test_a_request_round_trips_through_the_wire(request_: PodRequest) -> None:
    message = requests.pod_resources(request_)
    assert list(message.nodes) == sorted(request_.nodes)  # names sorted: one request, one encoding
    assert requests.pod_request(0, message) == request_


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (common_pb2.PodResources(gpus=1, gpu_fraction=0.5, gpu_memory_mib=1024), "pods[3]"),
        (common_pb2.PodResources(gpu_fraction=1.5, gpu_memory_mib=1024), "pods[3].gpu_fraction"),
        (common_pb2.PodResources(gpu_fraction=0.5), "pods[3].gpu_memory_mib"),
        (common_pb2.PodResources(gpus=65), "pods[3].gpus"),
        (common_pb2.PodResources(mig_profile="big"), "pods[3].mig_profile"),
        (common_pb2.PodResources(gpus=1, nodes=["ok", ""]), "pods[3].nodes[1]"),
        (common_pb2.PodResources(cpu_milli=2**60), "pods[3].cpu_milli"),
        (common_pb2.PodResources(gpus=1, node_preference={"n1": 100_001}), "pods[3].node_preference"),
        (common_pb2.PodResources(gpus=1, node_preference={"": 5}), "pods[3].node_preference"),
    ],
)
def test_an_invalid_request_names_its_field(message: common_pb2.PodResources, field: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        requests.pod_request(3, message)
    assert raised.value.field == field


def test_topology_levels_map_both_ways() -> None:
    for level, name in requests.TOPOLOGY_FROM_WIRE.items():
        if name:
            assert requests.TOPOLOGY_TO_WIRE[name] == level
    assert requests.TOPOLOGY_FROM_WIRE[common_pb2.TOPOLOGY_LEVEL_UNSPECIFIED] == ""


def test_node_preference_on_the_wire_keeps_only_scores_that_rank() -> None:
    # a score of 0 is what an unnamed node has: dropped, so two encodings of one preference compare equal
    message = common_pb2.PodResources(gpus=1, node_preference={"c": -2, "a": 0, "b": 7})
    assert requests.pod_request(0, message).node_preference == (("b", 7), ("c", -2))
