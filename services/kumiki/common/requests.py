"""A pod's request on the wire and back: `PodResources` to the scheduling core's `PodRequest` (validated, each
error naming its field) and back, and topology levels. One encoding for every service that sends or reads a
request: Placement decodes Bind requests and its own `job.lifecycle` log with it, the binder encodes its pods
and compares what Placement logged, so the two can never disagree on a unit or a field."""

from __future__ import annotations

import math

from kumiki.common.contracts.v1 import common_pb2
from kumiki.common.grpcutil import InvalidRequest
from kumiki.sched.jobs import MIB_PER_GB, PodRequest, RequestError

# wire level -> the scheduling core's GangRequest.required_topology (a preferred topology needs no field:
# the `kumiki` strategy always prefers one NVLink island, then one node, then one rack)
TOPOLOGY_FROM_WIRE = {
    common_pb2.TOPOLOGY_LEVEL_UNSPECIFIED: "",
    common_pb2.TOPOLOGY_LEVEL_NVLINK_ISLAND: "nvlink_island",
    common_pb2.TOPOLOGY_LEVEL_NODE: "node",
    common_pb2.TOPOLOGY_LEVEL_RACK: "rack",
}


TOPOLOGY_TO_WIRE = {name: level for level, name in TOPOLOGY_FROM_WIRE.items() if name}


MAX_NODE_NAMES = 20_000  # a pod's node rules as names: a cluster's worth, not unbounded
MAX_NODE_PREFERENCE = 100_000  # a preference score's bound (the binder's reach 900: four plugins, weighted)


def pod_request(index: int, pod: common_pb2.PodResources) -> PodRequest:
    where = f"pods[{index}]"
    forms = (pod.gpus > 0) + bool(pod.mig_profile) + (pod.gpu_fraction != 0)
    if forms > 1:
        raise InvalidRequest(where, "set only one of gpus, mig_profile, gpu_fraction")
    if pod.gpu_fraction != 0 and not (math.isfinite(pod.gpu_fraction) and 0 < pod.gpu_fraction < 1):
        raise InvalidRequest(f"{where}.gpu_fraction", f"must be within (0, 1), got {pod.gpu_fraction}")
    if pod.gpus > 64:
        raise InvalidRequest(f"{where}.gpus", f"must be <= 64 per pod, got {pod.gpus}")
    for name in ("gpu_memory_mib", "cpu_milli", "memory_mib"):  # held as doubles: past 2**53 they are not exact,
        if getattr(pod, name) > 2**53:  # and 2**64 - 1 MiB rounded back did not fit its uint64 (found by fuzzing)
            raise InvalidRequest(f"{where}.{name}", f"must be <= 2**53, got {getattr(pod, name)}")
    if pod.gpu_fraction and pod.gpu_memory_mib == 0:
        raise InvalidRequest(f"{where}.gpu_memory_mib", "required with gpu_fraction (the per-card memory cap)")
    if pod.mig_profile and "g." not in pod.mig_profile:
        raise InvalidRequest(f"{where}.mig_profile", f"expected a profile like 1g.10gb, got {pod.mig_profile!r}")
    for name in ("nodes", "avoid_nodes"):
        names = getattr(pod, name)
        if len(names) > MAX_NODE_NAMES:
            raise InvalidRequest(f"{where}.{name}", f"at most {MAX_NODE_NAMES} node names, got {len(names)}")
        for number, node in enumerate(names):
            if not node or len(node) > 253:
                raise InvalidRequest(f"{where}.{name}[{number}]", "a node name of 1 to 253 characters")
    if len(pod.node_preference) > MAX_NODE_NAMES:
        raise InvalidRequest(
            f"{where}.node_preference", f"at most {MAX_NODE_NAMES} nodes, got {len(pod.node_preference)}"
        )
    for node, score in pod.node_preference.items():
        shown = repr(node[:64]).replace("; ", ";")  # one problem per '; ' in a reason: a name must not add one
        if not node or len(node) > 253:
            raise InvalidRequest(f"{where}.node_preference", f"a node name of 1 to 253 characters, got {shown}")
        if abs(score) > MAX_NODE_PREFERENCE:
            raise InvalidRequest(
                f"{where}.node_preference", f"a score within +-{MAX_NODE_PREFERENCE}, got {score} for node {shown}"
            )
    try:
        return PodRequest(
            gpus=pod.gpus,
            gpu_fraction=pod.gpu_fraction,
            gpu_memory_gb=pod.gpu_memory_mib / MIB_PER_GB,
            mig_profile=pod.mig_profile,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
            gpu_model=pod.gpu_model,
            nodes=frozenset(pod.nodes),
            avoid_nodes=frozenset(pod.avoid_nodes),
            node_preference=tuple(sorted((node, score) for node, score in pod.node_preference.items() if score)),
        )
    except RequestError as error:
        raise InvalidRequest(where, str(error)) from None


def pod_resources(pod: PodRequest) -> common_pb2.PodResources:
    return common_pb2.PodResources(
        gpus=pod.gpus,
        mig_profile=pod.mig_profile,
        gpu_fraction=pod.gpu_fraction,
        gpu_memory_mib=round(pod.gpu_memory_gb * MIB_PER_GB),
        cpu_milli=pod.cpu_milli,
        memory_mib=pod.memory_mib,
        gpu_model=pod.gpu_model,
        nodes=sorted(pod.nodes),
        avoid_nodes=sorted(pod.avoid_nodes),
        node_preference=dict(pod.node_preference),
    )
