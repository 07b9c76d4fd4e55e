import pytest

from kumiki.sched.cluster import ClusterSpec, ClusterState, GpuShare, NodeSpec, Placement, PodPlacement, uniform_cluster
from kumiki.sched.jobs import GangRequest, PodRequest, consolidated_gang
from kumiki.sched.placement import DemandType, PendingReason, RequestMix, node_fragmentation, place_gang


def occupy(state: ClusterState, job: str, node: int, gpus: tuple[int, ...]) -> None:
    state.allocate(Placement(job, (PodPlacement(0, node, gpus),)))


def gang(job: str, *gpus: int, min_members: int = 0) -> GangRequest:
    return GangRequest(job, tuple(PodRequest(gpus=count) for count in gpus), min_members)


def test_gang_is_all_or_nothing():
    state = ClusterState.empty(uniform_cluster(2, 4))
    occupy(state, "x", 0, (0, 1))
    result = place_gang(state, gang("g", 4, 4), "best-fit")
    assert isinstance(result, PendingReason)
    assert result.resource == "gpu" and "all-or-nothing" in result.constraint and "1 of 2" in result.constraint
    assert state.free_whole == 6  # nothing held
    elastic = place_gang(state, gang("e", 4, 4, min_members=1), "best-fit")
    assert isinstance(elastic, Placement) and elastic.whole_gpus == 4


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [("best-fit", 1), ("spread", 2), ("first-fit", 0), ("kumiki", 1)],
)
def test_node_choice_per_strategy(strategy, expected):
    state = ClusterState.empty(uniform_cluster(3, 8))
    occupy(state, "a", 0, (0,))  # 7 free
    occupy(state, "b", 1, tuple(range(6)))  # 2 free
    result = place_gang(state, gang("j", 2), strategy)
    assert isinstance(result, Placement)
    assert result.nodes == (expected,)


def test_kumiki_prefers_one_nvlink_island():
    spec = uniform_cluster(1, 8, island_size=4)
    state = ClusterState.empty(spec)
    occupy(state, "a", 0, (0,))  # island 0 has 3 free, island 1 has 4 free
    placed = place_gang(state, gang("j", 3), "kumiki")
    assert isinstance(placed, Placement)
    assert set(placed.pods[0].gpus) == {1, 2, 3}  # best-fit island, keeps island 1 whole
    placed4 = place_gang(state, gang("k", 4), "kumiki")
    assert isinstance(placed4, Placement) and set(placed4.pods[0].gpus) == {4, 5, 6, 7}
    # first-fit ignores islands and straddles them
    straddle = place_gang(state, gang("k", 4), "first-fit")
    assert isinstance(straddle, Placement) and set(straddle.pods[0].gpus) == {1, 2, 3, 4}


def test_kumiki_prefers_nvlink_island_node_over_emptier_node():
    spec = uniform_cluster(2, 8, island_size=4)
    state = ClusterState.empty(spec)
    occupy(state, "a", 0, (0, 1, 4, 5))  # node 0: two islands with 2 free each
    occupy(state, "b", 1, (0,))  # node 1: 7 free, island 1 has 4
    placed = place_gang(state, gang("j", 4), "kumiki")
    assert isinstance(placed, Placement) and placed.nodes == (1,)
    assert set(placed.pods[0].gpus) == {4, 5, 6, 7}


def test_kumiki_keeps_a_multi_node_gang_in_one_rack():
    spec = uniform_cluster(4, 8, nodes_per_rack=2)
    state = ClusterState.empty(spec)
    occupy(state, "a", 0, (0,))  # rack 0 has one free node, rack 1 has two
    placed = place_gang(state, consolidated_gang("big", 16, 8), "kumiki")
    assert isinstance(placed, Placement) and placed.nodes == (2, 3)
    across = place_gang(state, consolidated_gang("big", 16, 8), "first-fit")
    assert isinstance(across, Placement) and across.nodes == (1, 2)


def test_kumiki_puts_a_small_gang_on_one_node():
    state = ClusterState.empty(uniform_cluster(2, 8))
    placed = place_gang(state, gang("g", 2, 2, 2), "kumiki")
    assert isinstance(placed, Placement) and len(placed.nodes) == 1


def test_excluded_nodes_are_never_used_and_explained():
    state = ClusterState.empty(uniform_cluster(2, 8))
    occupy(state, "a", 0, tuple(range(4)))
    result = place_gang(state, gang("j", 6), "best-fit", excluded_nodes=frozenset({1}))
    assert isinstance(result, PendingReason) and result.resource == "reservation"
    placed = place_gang(state, gang("j", 4), "best-fit", excluded_nodes=frozenset({1}))
    assert isinstance(placed, Placement) and placed.nodes == (0,)


def test_pending_reason_names_resource_and_shape():
    spec = ClusterSpec((NodeSpec("n", 4, cpu_milli=4000, memory_mib=4096),))
    state = ClusterState.empty(spec)
    too_big = place_gang(state, gang("j", 6), "kumiki")
    assert isinstance(too_big, PendingReason)
    assert (
        too_big.resource == "gpu"
        and "6 free whole GPUs" in too_big.constraint
        and "most free on one node: 4" in too_big.constraint
    )
    cpu = place_gang(state, GangRequest("c", (PodRequest(gpus=1, cpu_milli=8000),)), "kumiki")
    assert isinstance(cpu, PendingReason) and cpu.resource == "cpu"
    model = place_gang(state, GangRequest("m", (PodRequest(gpus=1, gpu_model="H100-80GB"),)), "kumiki")
    assert isinstance(model, PendingReason) and model.resource == "gpu_model"
    assert "H100" in model.explain()


def test_shared_gpu_placement_respects_caps():
    spec = ClusterSpec((NodeSpec("n", 1, gpu_memory_gb=16.0),))
    state = ClusterState.empty(spec)
    state.allocate(Placement("a", (PodPlacement(0, 0, share=GpuShare(0, 0.6, 4.0)),)))
    for strategy in ("spread", "best-fit", "first-fit", "kumiki"):
        compute = place_gang(state, GangRequest("b", (PodRequest(gpu_fraction=0.5, gpu_memory_gb=1.0),)), strategy)
        assert isinstance(compute, PendingReason) and compute.resource == "gpu_share"
        memory = place_gang(state, GangRequest("c", (PodRequest(gpu_fraction=0.3, gpu_memory_gb=13.0),)), strategy)
        assert isinstance(memory, PendingReason)
        fits = place_gang(state, GangRequest("d", (PodRequest(gpu_fraction=0.4, gpu_memory_gb=12.0),)), strategy)
        assert isinstance(fits, Placement)


def test_two_shares_of_one_gang_never_overfill_a_card():
    state = ClusterState.empty(ClusterSpec((NodeSpec("n", 2, gpu_memory_gb=16.0),)))
    request = GangRequest("g", tuple(PodRequest(gpu_fraction=0.6, gpu_memory_gb=1.0) for _ in range(2)))
    placed = place_gang(state, request, "best-fit")
    assert isinstance(placed, Placement)
    assert {pod.share.gpu for pod in placed.pods if pod.share} == {0, 1}
    state.allocate(placed)
    assert state.audit() == []


def test_best_fit_share_takes_the_fullest_card_that_fits():
    state = ClusterState.empty(ClusterSpec((NodeSpec("n", 3, gpu_memory_gb=32.0),)))
    state.allocate(Placement("a", (PodPlacement(0, 0, share=GpuShare(0, 0.5, 1.0)),)))
    state.allocate(Placement("b", (PodPlacement(0, 0, share=GpuShare(1, 0.8, 1.0)),)))
    placed = place_gang(state, GangRequest("c", (PodRequest(gpu_fraction=0.2),)), "best-fit")
    assert isinstance(placed, Placement) and placed.pods[0].share is not None and placed.pods[0].share.gpu == 1


def test_kumiki_share_placement_minimises_fragmentation():
    # mix of 0.5-GPU requests: a 0.5 pod should go onto the half-used card (leaving a whole card),
    # not onto the empty card (leaving two half cards... both usable) -- and a 0.3 pod should not
    # break the last whole card when a 0.5-used card can take it
    mix = RequestMix((DemandType(0.5, 0.5), DemandType(1.0, 0.5)))
    state = ClusterState.empty(ClusterSpec((NodeSpec("n", 2, gpu_memory_gb=32.0),)))
    state.allocate(Placement("a", (PodPlacement(0, 0, share=GpuShare(0, 0.5, 1.0)),)))
    placed = place_gang(state, GangRequest("b", (PodRequest(gpu_fraction=0.3),)), "kumiki", mix=mix)
    assert isinstance(placed, Placement) and placed.pods[0].share is not None and placed.pods[0].share.gpu == 0
    spread = place_gang(state, GangRequest("b", (PodRequest(gpu_fraction=0.3),)), "spread", mix=mix)
    assert isinstance(spread, Placement) and spread.pods[0].share is not None and spread.pods[0].share.gpu == 1


def test_node_fragmentation_definition():
    mix = RequestMix((DemandType(0.5, 0.5), DemandType(1.0, 0.5)))
    # free shares 0.3 and 1.0: for 0.5 requests the 0.3 card is stranded; for whole GPUs too
    assert node_fragmentation([0.3, 1.0], 0, 0, "V100-32GB", mix) == pytest.approx(0.3)
    # a node that cannot host the request at all strands everything it has free
    cpu_mix = RequestMix((DemandType(0.5, 1.0, cpu_milli=1000),))
    assert node_fragmentation([0.3, 1.0], 500, 0, "V100-32GB", cpu_mix) == pytest.approx(1.3)


def test_kumiki_mig_placement_keeps_large_profiles_available():
    spec = ClusterSpec((NodeSpec("m", 1, gpu_model="A100-40GB", gpu_memory_gb=40.0, mig_gpus=frozenset({0})),))
    state = ClusterState.empty(spec)
    mix = RequestMix((DemandType(4 / 7, 1.0, mig_profile="4g.20gb"),))
    placed = place_gang(state, GangRequest("s", (PodRequest(mig_profile="1g.5gb"),)), "kumiki", mix=mix)
    assert isinstance(placed, Placement) and placed.pods[0].mig is not None
    assert placed.pods[0].mig.start >= 4  # slot 0..3 stay free for the 4g profile
    first = place_gang(state, GangRequest("s", (PodRequest(mig_profile="1g.5gb"),)), "first-fit", mix=mix)
    assert isinstance(first, Placement) and first.pods[0].mig is not None and first.pods[0].mig.start == 0
    state.allocate(placed)
    assert state.audit() == []


def test_mig_request_on_non_mig_cluster_is_pending_with_reason():
    state = ClusterState.empty(uniform_cluster(1, 8))
    result = place_gang(state, GangRequest("s", (PodRequest(mig_profile="3g.20gb"),)), "kumiki")
    assert isinstance(result, PendingReason) and result.resource == "mig"


def test_unknown_strategy_is_rejected():
    with pytest.raises(ValueError, match="unknown placement strategy"):
        place_gang(ClusterState.empty(uniform_cluster(1, 1)), gang("j", 1), "random")
