"""Fragmentation scoring (kumiki.sched.fragmentation): the scalar definition, and the vectorised index that must
agree with it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.sched.fragmentation import DemandType, FragmentationIndex, MixArrays, RequestMix, node_fragmentation

SHARES = [0.25, 0.5, 0.3, 0.7, 0.45]


def test_node_fragmentation_definition():
    mix = RequestMix((DemandType(0.5, 0.5), DemandType(1.0, 0.5)))
    # free shares 0.3 and 1.0: for 0.5 requests the 0.3 card is stranded; for whole GPUs too
    assert node_fragmentation([0.3, 1.0], 0, 0, "V100-32GB", mix) == pytest.approx(0.3)
    # a node that cannot host the request at all strands everything it has free (1.3), and as its 500m of
    # CPU feeds only 0.25 GPU at the mix's 2,000m per GPU, 1.05 of it again: the score is a cost, and a
    # starved node costs more than its free capacity so that it is filled before fresh nodes are starved
    cpu_mix = RequestMix((DemandType(0.5, 1.0, cpu_milli=1000),))
    assert node_fragmentation([0.3, 1.0], 500, 0, "V100-32GB", cpu_mix) == pytest.approx(1.3 + (1.3 - 500 / 2000))


def test_fragmentation_index_matches_the_scalar_definition():
    prob_mix = MixArrays(
        gpu=np.array([0.5, 0.25, 1.0]),
        cpu=np.array([2000.0, 1000.0, 4000.0]),
        memory=np.zeros(3),
        weight=np.array([0.5, 0.3, 0.2]),
    )
    index = FragmentationIndex(np.array([4]), np.array([8000.0]), np.full(1, 1e9), prob_mix)
    index.take(0, [0], 0.7, 1000.0, 0.0)
    index.take(0, [1], 0.25, 0.0, 0.0)
    mix = RequestMix(
        tuple(
            DemandType(float(g), float(w), int(c))
            for g, w, c in zip(prob_mix.gpu, prob_mix.weight, prob_mix.cpu, strict=True)
        )
    )
    expected = node_fragmentation([0.3, 0.75, 1.0, 1.0], 7000, 10**9, "", mix)
    assert index.frag[0] == pytest.approx(expected)
    with pytest.raises(ValueError, match="cannot take"):
        index.take(0, [0], 0.5, 0.0, 0.0)


def test_node_fragmentation_counts_gpus_the_cpu_cannot_feed():
    # 3 free GPUs and CPU for one 6-core pod: FGD's count is 0 (one fits), the when-filled count is
    # 3 - 1 = 2 stranded GPUs, their mean 1.0; the mix (this shape alone) needs 6 cores per GPU, so
    # 10 cores feed 10/6 GPUs: 3 - 10/6 more. With 18 cores all three can be fed: 0.
    mix = RequestMix((DemandType(1.0, 1.0, cpu_milli=6000),))
    assert node_fragmentation([1.0, 1.0, 1.0], 10000, 10**6, "", mix) == pytest.approx(1.0 + 3 - 10 / 6)
    assert node_fragmentation([1.0, 1.0, 1.0], 18000, 10**6, "", mix) == pytest.approx(0.0)
    # shares: cards 0.6 and 0.3 for 0.25-GPU pods with 1 GiB each and 2 GiB free: 3 copies fit the
    # cards (2 + 1), memory allows 2, so 0.9 - 0.5 = 0.4 is stranded when filled; FGD's count is 0;
    # the mix needs 4 GiB per GPU, so 2 GiB feed 0.5 GPU: 0.4 more
    shares = RequestMix((DemandType(0.25, 1.0, memory_mib=1024),))
    assert node_fragmentation([0.6, 0.3], 0, 2048, "", shares) == pytest.approx(0.2 + 0.4)


@settings(max_examples=40, deadline=None)
@given(
    gpus=st.integers(1, 4),
    takes=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([*SHARES, 1.0]), st.sampled_from([0, 1000, 3000])),
        max_size=8,
    ),
)
def test_fragmentation_index_agrees_with_the_scalar_score_under_cpu_and_memory_limits(gpus, takes):
    mix = MixArrays(
        gpu=np.array([0.5, 0.25, 1.0, 2.0]),
        cpu=np.array([2000.0, 1000.0, 4000.0, 0.0]),
        memory=np.array([1024.0, 0.0, 2048.0, 4096.0]),
        weight=np.array([0.4, 0.3, 0.2, 0.1]),
    )
    index = FragmentationIndex(np.array([gpus]), np.array([9000.0]), np.array([6144.0]), mix)
    for card, share, cpu in takes:
        if card < gpus and index.free[0, card] >= share - 1e-9 and index.cpu[0] >= cpu:
            index.take(0, [card], share, float(cpu), 1024.0 if index.memory[0] >= 1024 else 0.0)
    scalar_mix = RequestMix(
        tuple(
            DemandType(float(g), float(w), int(c), int(m))
            for g, w, c, m in zip(mix.gpu, mix.weight, mix.cpu, mix.memory, strict=True)
        )
    )
    free = [max(0.0, float(share)) for share in index.free[0, :gpus]]
    expected = node_fragmentation(free, int(index.cpu[0]), int(index.memory[0]), "", scalar_mix)
    assert index.frag[0] == pytest.approx(expected)


def test_fragmentation_adds_the_gpus_the_mix_average_cpu_cannot_feed():
    # two 1-GPU shapes, 2 and 10 cores, equally popular: the mix needs 6 cores per GPU. A node with 2
    # free GPUs and 8 cores can feed 2 lean pods (the lean shape alone strands nothing), the heavy
    # shape not at all (both counts 2): 0.5 * 0 + 0.5 * 2 = 1; at the mix's average 8 cores feed only
    # 4/3 GPUs, so 2 - 4/3 more: 5/3.
    mix = RequestMix((DemandType(1.0, 0.5, cpu_milli=2000), DemandType(1.0, 0.5, cpu_milli=10000)))
    assert node_fragmentation([1.0, 1.0], 8000, 10**6, "", mix) == pytest.approx(5 / 3)
    # 12 cores feed both GPUs at the average: only the heavy shape's own count (one fits, 1 GPU left
    # when filled): 0.5 * (0 + 1) / 2
    assert node_fragmentation([1.0, 1.0], 12000, 10**6, "", mix) == pytest.approx(0.25)
    # no CPU: every count is 2, and the 2 GPUs no CPU feeds count once more (a cost, not capped): 4
    assert node_fragmentation([1.0, 1.0], 0, 10**6, "", mix) == pytest.approx(4.0)
    arrays = MixArrays(
        gpu=np.array([1.0, 1.0]), cpu=np.array([2000.0, 10000.0]), memory=np.zeros(2), weight=np.array([0.5, 0.5])
    )
    index = FragmentationIndex(np.array([2, 2, 2]), np.array([8000.0, 12000.0, 0.0]), np.full(3, 1e6), arrays)
    assert list(index.frag) == pytest.approx([5 / 3, 0.25, 4.0])
