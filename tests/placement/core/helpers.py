"""What the placement book's tests share: a node and a gang's Bind command."""

from __future__ import annotations

from kumiki.placement.core import BindCommand
from kumiki.sched.cluster import NodeSpec
from kumiki.sched.jobs import GangRequest, PodRequest


def node(name: str, gpus: int = 8, rack: str = "r0", islands: tuple[tuple[int, ...], ...] = ()) -> NodeSpec:
    return NodeSpec(name=name, gpus=gpus, gpu_model="A100-80GB", gpu_memory_gb=80.0, rack=rack, nvlink_islands=islands)


def gang(
    job: str, *gpus: int, generation: int = 1, tier: int = 0, topology: str = "", **options: object
) -> BindCommand:
    request = GangRequest(job, tuple(PodRequest(gpus=count) for count in gpus), required_topology=topology)
    return BindCommand(job_id=job, generation=generation, queue="q", request=request, priority_tier=tier, **options)  # type: ignore[arg-type]
