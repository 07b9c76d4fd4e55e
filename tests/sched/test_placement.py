from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.sched.cluster import ClusterSpec, ClusterState, GpuShare, NodeSpec, Placement, PodPlacement, uniform_cluster
from kumiki.sched.fragmentation import DemandType, RequestMix
from kumiki.sched.jobs import GangRequest, PodRequest, RequestError, consolidated_gang
from kumiki.sched.placement import PendingReason, could_host, place_gang


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


@pytest.mark.parametrize("strategy", ["best-fit", "spread", "first-fit", "kumiki"])
def test_whole_gpus_leave_sharing_nodes_to_fractions_while_dedicated_cards_are_free(strategy):
    # node 0 shares and has one card half used: best fit alone would fill its other 7 cards with whole GPUs
    spec = ClusterSpec((NodeSpec("share", 8, gpu_memory_gb=80.0), NodeSpec("whole", 8, sharing=False)))
    state = ClusterState.empty(spec)
    state.allocate(Placement("half", (PodPlacement(0, 0, share=GpuShare(0, 0.5, 16.0)),)))
    for number in range(8):
        placed = place_gang(state, gang(f"w{number}", 1), strategy)
        assert isinstance(placed, Placement) and placed.nodes == (1,), (strategy, number)
        state.allocate(placed)
    # the dedicated node is full: whole GPUs now go where they can
    overflow = place_gang(state, gang("w8", 2), strategy)
    assert isinstance(overflow, Placement) and overflow.nodes == (0,)
    assert state.audit() == []


def test_a_cluster_where_every_node_shares_places_whole_gpus_as_before():
    spec = ClusterSpec((NodeSpec("a", 8, gpu_memory_gb=80.0), NodeSpec("b", 8, gpu_memory_gb=80.0)))
    state = ClusterState.empty(spec)
    state.allocate(Placement("half", (PodPlacement(0, 0, share=GpuShare(0, 0.5, 16.0)),)))
    placed = place_gang(state, gang("w", 1), "best-fit")
    assert isinstance(placed, Placement) and placed.nodes == (0,)  # the fuller node, as best fit means


# ---- the occupancy-class index never changes a choice ---------------------------------------------

NODE_KINDS = (
    NodeSpec("v100", 8, "V100-32GB", 32.0, cpu_milli=32000, memory_mib=256000, sharing=True),
    NodeSpec(
        "a100", 8, "A100-80GB", 80.0, cpu_milli=64000, memory_mib=512000, nvlink_islands=((0, 1, 2, 3), (4, 5, 6, 7))
    ),
    NodeSpec(
        "a100-mig", 4, "A100-80GB", 80.0, cpu_milli=16000, memory_mib=128000, mig_gpus=frozenset({0, 1}), sharing=False
    ),
    NodeSpec("h100", 4, "H100-80GB", 80.0, cpu_milli=16000, memory_mib=128000, sharing=False),
)

pod_requests = st.one_of(
    st.builds(PodRequest, gpus=st.integers(1, 8), cpu_milli=st.sampled_from((0, 1000, 8000))),
    st.builds(
        PodRequest,
        gpu_fraction=st.sampled_from((0.25, 0.5, 0.75)),
        gpu_memory_gb=st.sampled_from((0.0, 8.0, 24.0)),
        cpu_milli=st.sampled_from((0, 2000)),
    ),
    st.builds(
        PodRequest,
        mig_profile=st.sampled_from(("1g.10gb", "2g.20gb", "3g.40gb")),
        memory_mib=st.sampled_from((0, 4096)),
    ),
    st.builds(PodRequest, cpu_milli=st.sampled_from((500, 4000))),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("bind"), st.lists(pod_requests, min_size=1, max_size=3)),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("exclude"), st.integers(0, 11)),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None)
@given(kinds=st.lists(st.integers(0, len(NODE_KINDS) - 1), min_size=1, max_size=12), script=steps)
def test_class_index_chooses_what_scoring_every_node_chooses(kinds, script):
    nodes = tuple(replace(NODE_KINDS[kind], name=f"n{i}", rack=f"r{i // 3}") for i, kind in enumerate(kinds))
    state = ClusterState.empty(ClusterSpec(nodes))
    excluded: frozenset[int] = frozenset()
    for number, (action, argument) in enumerate(script):
        if action == "release" and state.allocations:
            state.release(sorted(state.allocations)[argument % len(state.allocations)])
        elif action == "exclude":
            excluded = excluded ^ {argument % len(nodes)}
        elif action == "bind":
            request = GangRequest(f"job-{number}", tuple(argument))
            chosen = None
            for strategy in ("kumiki", "best-fit", "spread", "first-fit"):
                fast = place_gang(state, request, strategy, excluded_nodes=excluded)
                full = place_gang(state, request, strategy, excluded_nodes=excluded, by_class=False)
                assert fast == full, strategy
                chosen = chosen or (fast if isinstance(fast, Placement) else None)
            if chosen is not None:
                state.allocate(chosen)
        assert state.audit() == []


def test_nodes_alike_in_gpus_but_not_in_cpu_are_not_interchangeable():
    node = NodeSpec("n", 8, cpu_milli=8000, memory_mib=64000)
    state = ClusterState.empty(ClusterSpec((replace(node, name="a"), replace(node, name="b"))))
    state.allocate(Placement("cpu-hog", (PodPlacement(0, 0, cpu_milli=6000),)))
    for strategy in ("kumiki", "best-fit", "first-fit"):
        placed = place_gang(state, GangRequest("j", (PodRequest(gpus=1, cpu_milli=4000),)), strategy)
        assert isinstance(placed, Placement) and placed.nodes == (1,), strategy  # node 0 lacks the CPU


def test_required_node_tries_every_node_not_only_the_fullest():
    """The three fullest nodes that have the GPUs lack the CPU; only the fifth can hold the gang on one node."""
    node = NodeSpec("n", 8, cpu_milli=16000, memory_mib=64000)
    state = ClusterState.empty(ClusterSpec(tuple(replace(node, name=f"n{i}", rack="r0") for i in range(5))))
    for index in range(4):  # nodes 0-3: 4 GPUs free but only 2 cores
        state.allocate(Placement(f"busy-{index}", (PodPlacement(0, index, (0, 1, 2, 3), cpu_milli=14000),)))
    pods = tuple(PodRequest(gpus=2, cpu_milli=3000) for _ in range(2))
    placed = place_gang(state, GangRequest("g", pods, required_topology="node"), "kumiki")
    assert isinstance(placed, Placement) and placed.nodes == (4,)
    # two half-free nodes: the gang fits only by spreading, which a required node forbids, and says so
    spread_out = ClusterState.empty(uniform_cluster(2, 8))
    occupy(spread_out, "a", 0, (0, 1, 2, 3))
    occupy(spread_out, "b", 1, (0, 1, 2, 3))
    request = GangRequest("w", (PodRequest(gpus=4), PodRequest(gpus=4)), required_topology="node")
    blocked = place_gang(spread_out, request, "kumiki")
    assert isinstance(blocked, PendingReason) and blocked.resource == "topology:node"
    assert isinstance(place_gang(spread_out, replace(request, required_topology=""), "kumiki"), Placement)


def test_required_nvlink_island_keeps_every_pod_in_one_island():
    spec = uniform_cluster(1, 8, island_size=4)
    state = ClusterState.empty(spec)
    occupy(state, "a", 0, (0, 1, 4, 5))  # two free GPUs in each island
    gang3 = GangRequest("g", (PodRequest(gpus=3),), required_topology="nvlink_island")
    reason = place_gang(state, gang3, "kumiki")
    assert isinstance(reason, PendingReason) and reason.resource == "topology:nvlink_island"
    pair = place_gang(
        state, GangRequest("p", (PodRequest(gpus=1), PodRequest(gpus=1)), required_topology="nvlink_island"), "best-fit"
    )
    assert isinstance(pair, Placement)
    gpus = {gpu for pod in pair.pods for gpu in pod.gpus}
    assert gpus <= {2, 3} or gpus <= {6, 7}


def test_cordoned_nodes_receive_no_work_of_any_kind():
    spec = ClusterSpec(
        (
            NodeSpec("a", 8, sharing=True),
            NodeSpec("b", 8, sharing=True),
            NodeSpec("m", 4, "A100-80GB", 80.0, mig_gpus=frozenset({0, 1, 2, 3}), sharing=False),
        )
    )
    state = ClusterState.empty(spec)
    state.cordoned = frozenset({0, 2})
    for request in (
        GangRequest("whole", (PodRequest(gpus=2),)),
        GangRequest("share", (PodRequest(gpu_fraction=0.5, gpu_memory_gb=4),)),
        GangRequest("cpu", (PodRequest(cpu_milli=0),)),
    ):
        placed = place_gang(state, request, "kumiki")
        assert isinstance(placed, Placement) and placed.nodes == (1,), request.job_id
    assert isinstance(
        place_gang(state, GangRequest("mig", (PodRequest(mig_profile="1g.10gb"),)), "kumiki"), PendingReason
    )


def test_could_host_agrees_with_placing_on_an_empty_node():
    """could_host is the capacity-only question: on an empty one-node cluster it must match place_gang."""
    shapes = (
        NodeSpec("v", 8, "V100-32GB", 32.0, cpu_milli=8000, memory_mib=64000, sharing=True),
        NodeSpec(
            "m", 4, "A100-80GB", 80.0, cpu_milli=8000, memory_mib=64000, mig_gpus=frozenset({0, 1}), sharing=False
        ),
        NodeSpec("h", 4, "H100-80GB", 80.0, cpu_milli=4000, memory_mib=32000, sharing=False),
    )
    pods = (
        PodRequest(gpus=2),
        PodRequest(gpus=4, cpu_milli=6000),
        PodRequest(gpus=8),
        PodRequest(gpu_fraction=0.5, gpu_memory_gb=16),
        PodRequest(gpu_fraction=0.5, gpu_memory_gb=48),
        PodRequest(mig_profile="3g.40gb"),
        PodRequest(mig_profile="1g.5gb"),
        PodRequest(gpus=1, gpu_model="H100-80GB"),
        PodRequest(cpu_milli=5000),
    )
    for spec in shapes:
        for pod in pods:
            empty = ClusterState.empty(ClusterSpec((spec,)))
            fits = isinstance(place_gang(empty, GangRequest("j", (pod,)), "best-fit"), Placement)
            assert could_host(spec, pod) == fits, (spec.name, pod)


def test_pod_node_rules_are_honoured_across_an_occupancy_class():
    # three identical empty nodes are one occupancy class: a pod that may use only the last one must get it,
    # never the class's first node, and one that avoids two of them gets the third
    state = ClusterState.empty(uniform_cluster(3, 8))
    names = [node.name for node in state.spec.nodes]
    only_last = GangRequest("j", (PodRequest(gpus=8, nodes=frozenset({names[2]})),))
    placed = place_gang(state, only_last, "best-fit")
    assert isinstance(placed, Placement) and placed.nodes == (2,)
    avoid = GangRequest("k", (PodRequest(gpus=1, avoid_nodes=frozenset(names[:2])),) * 2)
    placed = place_gang(state, avoid, "kumiki")
    assert isinstance(placed, Placement) and set(placed.nodes) == {2}
    occupy(state, "x", 2, tuple(range(8)))
    blocked = place_gang(state, only_last, "best-fit")
    assert isinstance(blocked, PendingReason)  # the other nodes are free, but the pod may not use them
    assert could_host(state.spec.nodes[2], only_last.pods[0]) and not could_host(state.spec.nodes[0], only_last.pods[0])


@pytest.mark.parametrize("strategy", ["best-fit", "spread", "first-fit", "kumiki"])
def test_distinct_nodes_gives_each_pod_a_node_of_its_own(strategy):
    state = ClusterState.empty(uniform_cluster(4, 8))
    occupy(state, "x", 1, (0, 1, 2, 3))  # node 1 half full: best-fit and kumiki would put both pods on it
    packed = place_gang(state, gang("p", 2, 2), strategy)
    spread = place_gang(state, replace(gang("s", 2, 2, 2), distinct_nodes=True), strategy)
    assert isinstance(packed, Placement) and isinstance(spread, Placement)
    if strategy in ("best-fit", "kumiki", "first-fit"):
        assert len(packed.nodes) == 1  # without the constraint the pods share a node
    assert len({pod.node for pod in spread.pods}) == 3, spread
    # scoring one node per occupancy class chooses as scoring every node does
    assert place_gang(state, replace(gang("s", 2, 2, 2), distinct_nodes=True), strategy, by_class=False) == spread


def test_distinct_nodes_waits_with_its_own_reason_when_the_room_is_on_too_few_nodes():
    state = ClusterState.empty(uniform_cluster(2, 8))
    occupy(state, "x", 1, tuple(range(8)))  # only node 0 has room: for both pods, not for one each
    request = replace(gang("s", 2, 2), distinct_nodes=True)
    reason = place_gang(state, request, "kumiki")
    assert isinstance(reason, PendingReason)
    assert reason.resource == "topology:distinct_nodes" and "node of its own" in reason.constraint
    assert isinstance(place_gang(state, gang("s", 2, 2), "kumiki"), Placement)
    # an elastic gang keeps the pods that fit on nodes of their own
    elastic = place_gang(state, replace(gang("e", 2, 2, min_members=1), distinct_nodes=True), "kumiki")
    assert isinstance(elastic, Placement) and len(elastic.pods) == 1


def test_distinct_nodes_cannot_share_one_node():
    with pytest.raises(RequestError, match="distinct_nodes"):
        replace(gang("s", 2, 2), distinct_nodes=True, required_topology="node")
    lone = replace(gang("s", 2), distinct_nodes=True, required_topology="node")  # one pod: nothing to spread
    assert lone.distinct_nodes


def prefer(pod: PodRequest, **scores: int) -> PodRequest:
    return replace(pod, node_preference=tuple(sorted(scores.items())))


@pytest.mark.parametrize("strategy", ["best-fit", "spread", "first-fit", "kumiki"])
def test_a_preferred_node_that_fits_wins_over_the_strategy_choice(strategy):
    # node 1 half full: best-fit and kumiki pack onto it, spread and first-fit take node 0; the pod prefers
    # node 2 (and would rather not use node 1), so every strategy takes node 2
    state = ClusterState.empty(uniform_cluster(4, 8))
    occupy(state, "x", 1, (0, 1, 2, 3))
    names = [node.name for node in state.spec.nodes]
    plain = place_gang(state, GangRequest("p", (PodRequest(gpus=2),)), strategy)
    assert isinstance(plain, Placement) and plain.nodes != (2,)
    pod = prefer(PodRequest(gpus=2), **{names[2]: 200, names[1]: -50})
    placed = place_gang(state, GangRequest("q", (pod,)), strategy)
    assert isinstance(placed, Placement) and placed.nodes == (2,), placed
    # nodes of equal score: the strategy decides between them as before
    equal = prefer(PodRequest(gpus=2), **{names[0]: 10, names[1]: 10, names[2]: 10, names[3]: 10})
    assert place_gang(state, GangRequest("p", (equal,)), strategy) == plain


@pytest.mark.parametrize("strategy", ["best-fit", "spread", "first-fit", "kumiki"])
def test_a_preference_never_makes_a_pod_wait(strategy):
    state = ClusterState.empty(uniform_cluster(3, 8))
    occupy(state, "x", 2, tuple(range(8)))  # the preferred node is full
    names = [node.name for node in state.spec.nodes]
    pod = prefer(PodRequest(gpus=4), **{names[2]: 900, names[0]: -300})
    placed = place_gang(state, GangRequest("q", (pod,)), strategy)
    assert isinstance(placed, Placement) and placed.nodes == (1,)  # the next best that fits, not the disliked


@pytest.mark.parametrize("strategy", ["best-fit", "spread", "first-fit", "kumiki"])
def test_preferences_rank_shares_mig_slices_and_cpu_pods(strategy):
    spec = ClusterSpec(
        tuple(
            NodeSpec(f"n{i}", 2, gpu_memory_gb=32.0, sharing=True, cpu_milli=16000, memory_mib=65536) for i in range(3)
        )
        + tuple(
            NodeSpec(f"m{i}", 1, gpu_model="A100-40GB", gpu_memory_gb=40.0, mig_gpus=frozenset({0})) for i in range(3)
        )
    )
    state = ClusterState.empty(spec)
    share = prefer(PodRequest(gpu_fraction=0.5, gpu_memory_gb=1.0), n2=5)
    mig = prefer(PodRequest(mig_profile="1g.5gb"), m1=5)
    cpu = prefer(PodRequest(cpu_milli=1000), n1=7)
    for pod, name in ((share, "n2"), (mig, "m1"), (cpu, "n1")):
        placed = place_gang(state, GangRequest("s", (pod,)), strategy)
        assert isinstance(placed, Placement) and spec.nodes[placed.nodes[0]].name == name, (pod, placed)
        unpreferred = place_gang(state, GangRequest("s", (replace(pod, node_preference=()),)), strategy)
        assert isinstance(unpreferred, Placement) and spec.nodes[unpreferred.nodes[0]].name != name


def test_a_gang_with_preferences_chooses_as_scoring_every_node_does():
    # identical empty nodes are one occupancy class; preferences tell them apart
    state = ClusterState.empty(uniform_cluster(4, 8))
    names = [node.name for node in state.spec.nodes]
    pods = tuple(prefer(PodRequest(gpus=8), **{names[3]: 3, names[1]: 2}) for _ in range(2))
    placed = place_gang(state, GangRequest("g", pods), "kumiki")
    assert isinstance(placed, Placement) and sorted(placed.nodes) == [1, 3]
    assert place_gang(state, GangRequest("g", pods), "kumiki", by_class=False) == placed


def test_a_gangs_preferences_choose_the_node_or_rack_it_is_kept_in():
    # 4 nodes in 2 racks; node 0 half full, the fullest that fits: kumiki keeps a small gang on it, unless the
    # pods prefer node 3; a gang spanning nodes goes to the fuller rack-0, or to rack-1 when they prefer a node
    # there
    spec = ClusterSpec(tuple(NodeSpec(f"n{i}", 8, rack=f"rack-{i // 2}") for i in range(4)))
    state = ClusterState.empty(spec)
    occupy(state, "x", 0, (0, 1, 2, 3))
    small = GangRequest("s", (PodRequest(gpus=2), PodRequest(gpus=2)))
    assert place_gang(state, small, "kumiki").nodes == (0,)
    preferring = GangRequest("s", tuple(prefer(pod, n3=10) for pod in small.pods))
    assert place_gang(state, preferring, "kumiki").nodes == (3,)
    wide = GangRequest("w", (PodRequest(gpus=4), PodRequest(gpus=4)), distinct_nodes=True)  # no single node
    placed = place_gang(state, wide, "kumiki")
    assert isinstance(placed, Placement) and sorted(placed.nodes) == [0, 1]  # the fuller rack
    wide_preferring = replace(wide, pods=tuple(prefer(pod, n2=5) for pod in wide.pods))
    placed_there = place_gang(state, wide_preferring, "kumiki")
    assert isinstance(placed_there, Placement) and sorted(placed_there.nodes) == [2, 3]
    # a required single node: the preferred node that fits, before the fullest
    one = replace(preferring, required_topology="node")
    assert place_gang(state, one, "kumiki").nodes == (3,)
    assert place_gang(state, replace(small, required_topology="node"), "kumiki").nodes == (0,)


@pytest.mark.parametrize("strategy", ["best-fit", "spread", "first-fit", "kumiki"])
def test_a_disliked_node_is_skipped_though_it_represents_its_occupancy_class(strategy):
    # four identical empty nodes are one occupancy class, node 0 its representative: a pod that dislikes
    # nodes 0 and 1 gets node 2 (the class's next member), and node 0 only once nothing else fits
    state = ClusterState.empty(uniform_cluster(4, 8))
    names = [node.name for node in state.spec.nodes]
    pod = prefer(PodRequest(gpus=8), **{names[0]: -50, names[1]: -10})
    placed = place_gang(state, GangRequest("p", (pod,)), strategy)
    assert isinstance(placed, Placement) and placed.nodes == (2,)
    for node in (2, 3):
        occupy(state, f"x{node}", node, tuple(range(8)))
    assert place_gang(state, GangRequest("p", (pod,)), strategy).nodes == (1,)  # the less disliked first
    occupy(state, "x1", 1, tuple(range(8)))
    assert place_gang(state, GangRequest("p", (pod,)), strategy).nodes == (0,)


@settings(max_examples=150, deadline=None)
@given(
    kinds=st.lists(st.integers(0, len(NODE_KINDS) - 1), min_size=1, max_size=10),
    held=st.lists(st.lists(pod_requests, min_size=1, max_size=2), max_size=8),
    pod=pod_requests,
    scores=st.dictionaries(st.integers(0, 9), st.integers(-3, 3), max_size=6),
)
def test_a_preferred_placement_is_on_a_best_scored_node_that_fits_and_the_class_index_agrees(kinds, held, pod, scores):
    nodes = tuple(replace(NODE_KINDS[kind], name=f"n{i}", rack=f"r{i // 3}") for i, kind in enumerate(kinds))
    state = ClusterState.empty(ClusterSpec(nodes))
    for number, pods in enumerate(held):  # some occupancy, as the strategy places it
        placed = place_gang(state, GangRequest(f"held-{number}", tuple(pods)), "kumiki")
        if isinstance(placed, Placement):
            state.allocate(placed)
    preference = tuple(sorted((f"n{index}", score) for index, score in scores.items() if index < len(nodes)))
    request = GangRequest("p", (replace(pod, node_preference=preference),))
    score = dict(preference)
    for strategy in ("kumiki", "best-fit", "spread", "first-fit"):
        fast = place_gang(state, request, strategy)
        assert fast == place_gang(state, request, strategy, by_class=False), strategy
        fits = [
            node.name
            for node in nodes
            if isinstance(
                place_gang(state, GangRequest("p", (replace(pod, nodes=frozenset({node.name})),)), strategy), Placement
            )
        ]
        if not fits:
            assert isinstance(fast, PendingReason)  # a preference never makes a pod wait, nor lets it in
            continue
        assert isinstance(fast, Placement), strategy
        chosen = nodes[fast.nodes[0]].name
        assert score.get(chosen, 0) == max(score.get(name, 0) for name in fits), (strategy, chosen, fits)
