import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.sched.cluster import ClusterSpec, ClusterState, NodeSpec, Placement
from kumiki.sched.fragmentation import DemandType, FragmentationIndex, MixArrays, RequestMix
from kumiki.sched.jobs import GangRequest, PodRequest
from kumiki.sched.placement import place_gang
from kumiki.sim.pack import PackError, PackPod, PackProblem, arrival_order, choose, prepare, run_pack
from kumiki.sim.trace import TraceJob, TraceNode

SHARES = [0.25, 0.5, 0.3, 0.7, 0.45]


def problem(gpus, cpus, pods):
    mix = MixArrays(
        gpu=np.array([0.5, 0.25, 1.0]),
        cpu=np.array([2000.0, 1000.0, 4000.0]),
        memory=np.zeros(3),
        weight=np.array([0.5, 0.3, 0.2]),
    )
    return PackProblem(
        tuple(pods), np.array(gpus), np.array(cpus, dtype=float), np.full(len(gpus), 1e9), tuple("" for _ in gpus), mix
    )


@settings(max_examples=30, deadline=None)
@given(
    gpus=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    requests=st.lists(st.tuples(st.sampled_from(SHARES), st.sampled_from([0, 1000, 3000])), min_size=1, max_size=20),
    strategy=st.sampled_from(["best-fit", "first-fit", "spread", "kumiki"]),
)
def test_vectorised_pack_chooses_what_place_gang_chooses(gpus, requests, strategy):
    """The benchmark's numpy path and the service's placement code pick the same card for shared pods."""
    cpus = [8000.0] * len(gpus)
    pods = [PackPod(share, float(cpu), 0.0, "") for share, cpu in requests]
    prob = problem(gpus, cpus, pods)
    index = FragmentationIndex(prob.gpus, prob.cpu_milli, prob.memory_mib, prob.mix)
    spec = ClusterSpec(
        tuple(
            NodeSpec(f"n{i}", count, gpu_memory_gb=1e6, cpu_milli=8000, memory_mib=10**9)
            for i, count in enumerate(gpus)
        )
    )
    state = ClusterState.empty(spec)
    mix = RequestMix(
        tuple(
            DemandType(float(g), float(w), int(c))
            for g, w, c in zip(prob.mix.gpu, prob.mix.weight, prob.mix.cpu, strict=True)
        )
    )
    for number, pod in enumerate(pods):
        ours = choose(index, prob, pod, strategy)
        request = GangRequest(f"p{number}", (PodRequest(gpu_fraction=pod.gpu, cpu_milli=int(pod.cpu_milli)),))
        theirs = place_gang(state, request, strategy, mix=mix)
        if ours is None:
            assert not isinstance(theirs, Placement)
            continue
        assert isinstance(theirs, Placement)
        share = theirs.pods[0].share
        assert share is not None and (theirs.pods[0].node, [share.gpu]) == ours
        index.take(ours[0], ours[1], pod.gpu, pod.cpu_milli, 0.0)
        state.allocate(theirs)
    assert np.all(index.free >= -1e-9)
    assert state.audit() == []


def test_arrival_order_seed_zero_starts_with_file_order():
    first = arrival_order(5, 0)
    assert [first() for _ in range(5)] == [0, 1, 2, 3, 4]
    repeat = sorted(first() for _ in range(5))
    assert repeat == [0, 1, 2, 3, 4]
    shuffled = arrival_order(50, 3)
    assert [shuffled() for _ in range(50)] != list(range(50))


def test_run_stops_when_requests_reach_capacity_and_counts_failures():
    pods = [TraceJob(f"p{i}", 0.0, g, 1.0, 1.0, None, "", "", "", "") for i, g in enumerate([1.0, 0.5, 2.0])]
    nodes = [TraceNode("a", 4000, 8192, 2, ""), TraceNode("b", 4000, 8192, 1, "")]
    prob = prepare(pods, nodes)
    result = run_pack(prob, "best-fit", 0)
    # arrivals: 1.0, 0.5, 2.0 (fails: node a has 1 whole GPU left) -> 3.5 requested >= 3 capacity
    assert result.arrivals == 3 and result.failed == 1 and result.first_failure_arrival == 3
    assert result.unallocated_share == pytest.approx(1.5 / 3)


def test_prepare_names_bad_fields():
    with pytest.raises(PackError, match="cpus"):
        prepare([TraceJob("p", 0.0, 1.0, None, 1.0, None, "", "", "", "")], [TraceNode("a", 1, 1, 1, "")])
    with pytest.raises(PackError, match="whole"):
        prepare([TraceJob("p", 0.0, 1.5, 1.0, 1.0, None, "", "", "", "")], [TraceNode("a", 1, 1, 1, "")])


def test_kumiki_keeps_cpu_for_the_gpus_that_best_fit_strands():
    """A tiny cluster where the CPU-aware score provably strands less than best-fit (and than FGD alone).

    Nodes A (3 GPUs, 20 cores) and B (3 GPUs, 60 cores); pods in this order: one 1-GPU pod with 10
    cores, then five 1-GPU pods with 6 cores (6 GPUs requested = capacity). The mix is the 6-core shape
    (5 of 6 pods, the 80% cut drops the rarer one), weight 1.
    - best-fit: the 10-core pod ties on free GPUs and goes to A (lowest index): A has 2 GPUs, 10 cores;
      the next 6-core pod goes to the fuller A (1 GPU, 4 cores left): A's last GPU can never take a
      6-core pod. B takes three, the sixth pod is dropped: 1 of 6 GPUs unallocated.
    - kumiki: the 10-core pod on A leaves 2 GPUs and CPU for floor(10/6) = 1 pod: the when-filled count
      strands 2 - 1 = 1 GPU, FGD's count 0 (one pod still fits), so A scores (0 + 1) / 2 = 0.5; on B it
      leaves 2 GPUs and 50 cores (8 pods): 0. It goes to B; every 6-core pod then scores 0 everywhere
      and best-fit ties fill B, then A's 20 cores take the last three: nothing unallocated.
      FGD's count alone scores both nodes 0 for the first pod, ties to A and strands like best-fit.
    """
    pods = [TraceJob("big", 0.0, 1.0, 10.0, 1.0, None, "", "", "", "")]
    pods += [TraceJob(f"p{i}", 0.0, 1.0, 6.0, 1.0, None, "", "", "", "") for i in range(5)]
    nodes = [TraceNode("a", 20000, 10**6, 3, ""), TraceNode("b", 60000, 10**6, 3, "")]
    prob = prepare(pods, nodes)
    assert list(prob.mix.cpu) == [6000.0] and list(prob.mix.weight) == [1.0]
    best_fit = run_pack(prob, "best-fit", 0)
    kumiki = run_pack(prob, "kumiki", 0)
    assert best_fit.arrivals == kumiki.arrivals == 6
    assert best_fit.failed == 1 and best_fit.unallocated_share == pytest.approx(1 / 6)
    assert kumiki.failed == 0 and kumiki.unallocated_share == pytest.approx(0.0)
    index = FragmentationIndex(prob.gpus, prob.cpu_milli, prob.memory_mib, prob.mix)
    assert choose(index, prob, prob.pods[0], "kumiki") == (1, [0])
    assert choose(index, prob, prob.pods[0], "best-fit") == (0, [0])


def test_mix_keeps_the_popular_shapes_covering_most_gpu_pods():
    shapes = [(1.0, 6.0)] * 6 + [(0.5, 2.0)] * 3 + [(0.25, 1.0)]
    pods = [TraceJob(f"p{i}", 0.0, g, c, 1.0, None, "", "", "", "") for i, (g, c) in enumerate(shapes)]
    prob = prepare(pods, [TraceNode("a", 64000, 10**6, 8, "")])
    # 6 + 3 of 10 pods reach 80%; the 1-in-10 shape is left out and the weights renormalised
    assert list(prob.mix.gpu) == [1.0, 0.5]
    assert list(prob.mix.weight) == pytest.approx([6 / 9, 3 / 9])
