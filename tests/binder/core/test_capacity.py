"""Why a pod could never fit, and which node changes change the cluster's capacity."""

from __future__ import annotations

from kumiki.binder import core
from kumiki.sched.jobs import PodRequest
from tests.binder.core.support import node_named
from tests.binder.support import node_object


def test_never_fits_says_why() -> None:
    nodes = [core.parse_node(node_object("n1", 8))]
    assert "largest node has 8" in core.never_fits(PodRequest(gpus=16), nodes)
    assert "no node is in MIG mode" in core.never_fits(PodRequest(mig_profile="1g.10gb"), nodes)
    assert core.never_fits(PodRequest(gpus=8), nodes) == ""


def test_cluster_capacity_never_fits_and_changes() -> None:
    nodes = [node_named("a"), node_named("b")]
    capacity = core.ClusterCapacity.of(nodes)
    assert capacity.never_fits(PodRequest(gpus=8)) == ""
    assert capacity.never_fits(PodRequest(gpus=9)) == "asks for 9 GPUs; the largest node has 8"
    assert not capacity.tainted
    assert core.ClusterCapacity.of([]).never_fits(PodRequest(gpus=1)) == "no nodes in the cluster"
    heartbeat = node_named("a")
    assert not core.capacity_changed(nodes[0], heartbeat)
    assert core.capacity_changed(nodes[0], node_named("a", taints=[{"key": "k", "effect": "NoSchedule"}]))
