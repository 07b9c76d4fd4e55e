import pytest

from kumiki.sched.cluster import (
    AllocationError,
    ClusterSpec,
    ClusterState,
    GpuShare,
    MigSlice,
    NodeSpec,
    Placement,
    PodPlacement,
    uniform_cluster,
)


def shared_node() -> ClusterState:
    return ClusterState.empty(ClusterSpec((NodeSpec("n0", 2, gpu_memory_gb=16.0, cpu_milli=8000, memory_mib=8192),)))


def test_whole_gpu_is_never_given_twice():
    state = ClusterState.empty(uniform_cluster(1, 4))
    state.allocate(Placement("a", (PodPlacement(0, 0, (0, 1)),)))
    with pytest.raises(AllocationError, match="already allocated"):
        state.allocate(Placement("b", (PodPlacement(0, 0, (1, 2)),)))
    with pytest.raises(AllocationError, match="already allocated"):
        state.allocate(Placement("c", (PodPlacement(0, 0, (2,)), PodPlacement(1, 0, (2,)))))
    # the failed attempts changed nothing
    assert state.free_count(0) == 2 and state.audit() == []
    state.release("a")
    assert state.free_count(0) == 4
    with pytest.raises(AllocationError, match="holds no allocation"):
        state.release("a")


def test_shared_gpu_caps_on_compute_and_memory():
    state = shared_node()
    state.allocate(Placement("a", (PodPlacement(0, 0, share=GpuShare(0, 0.5, 8.0)),)))
    state.allocate(Placement("b", (PodPlacement(0, 0, share=GpuShare(0, 0.3, 4.0)),)))
    with pytest.raises(AllocationError, match="compute share"):
        state.allocate(Placement("c", (PodPlacement(0, 0, share=GpuShare(0, 0.3, 1.0)),)))
    with pytest.raises(AllocationError, match="memory"):
        state.allocate(Placement("d", (PodPlacement(0, 0, share=GpuShare(0, 0.2, 5.0)),)))
    # a card with shares cannot be taken whole, and it is free again only when the last share leaves
    with pytest.raises(AllocationError):
        state.allocate(Placement("e", (PodPlacement(0, 0, (0,)),)))
    state.release("a")
    assert 0 not in state.nodes[0].free_gpus
    state.release("b")
    assert 0 in state.nodes[0].free_gpus and state.audit() == []


def test_mig_slices_are_exclusive_and_valid():
    spec = ClusterSpec((NodeSpec("m0", 1, gpu_model="A100-40GB", gpu_memory_gb=40.0, mig_gpus=frozenset({0})),))
    state = ClusterState.empty(spec)
    assert state.free_whole == 0  # a MIG GPU is never handed out whole
    state.allocate(Placement("a", (PodPlacement(0, 0, mig=MigSlice(0, "3g.20gb", 4)),)))
    with pytest.raises(AllocationError, match="already allocated"):
        state.allocate(Placement("b", (PodPlacement(0, 0, mig=MigSlice(0, "1g.5gb", 6)),)))
    with pytest.raises(AllocationError, match="cannot start"):
        state.allocate(Placement("c", (PodPlacement(0, 0, mig=MigSlice(0, "4g.20gb", 4)),)))
    with pytest.raises(AllocationError, match="not valid"):
        state.allocate(Placement("d", (PodPlacement(0, 0, mig=MigSlice(0, "1g.10gb", 0)),)))
    state.allocate(Placement("e", (PodPlacement(0, 0, mig=MigSlice(0, "3g.20gb", 0)),)))
    with pytest.raises(AllocationError, match="cannot be allocated whole"):
        state.allocate(Placement("f", (PodPlacement(0, 0, (0,)),)))


def test_cpu_and_memory_are_never_overcommitted():
    state = shared_node()
    state.allocate(Placement("a", (PodPlacement(0, 0, (0,), cpu_milli=6000, memory_mib=1024),)))
    with pytest.raises(AllocationError, match="CPU"):
        state.allocate(Placement("b", (PodPlacement(0, 0, (1,), cpu_milli=4000),)))


def test_mig_requires_a_capable_model():
    with pytest.raises(ValueError, match="not MIG-capable"):
        NodeSpec("x", 1, gpu_model="V100-32GB", mig_gpus=frozenset({0}))
    with pytest.raises(ValueError, match="partition"):
        NodeSpec("x", 4, nvlink_islands=((0, 1), (1, 2, 3)))
