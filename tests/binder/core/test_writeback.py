"""What the binder writes on a bound pod: job, generation, GPU UUIDs, MIG slice, fraction."""

from __future__ import annotations

from kumiki.binder import core
from tests.binder.support import node_object


def test_assignment_annotations_carry_uuids_slices_and_fractions() -> None:
    node = core.parse_node(node_object("n1", 8))
    whole = core.assignment_annotations("ns/g", 2, core.PodAssignment(0, "n1", gpu_indices=(2, 3)), node)
    assert whole[core.GPU_UUIDS_ANNOTATION] == "GPU-n1-2,GPU-n1-3" and whole[core.GENERATION_ANNOTATION] == "2"
    mig = core.assignment_annotations(
        "ns/m", 1, core.PodAssignment(0, "n1", gpu_indices=(5,), mig_slice="1g.10gb@3"), node
    )
    assert mig[core.MIG_SLICE_ANNOTATION] == "1g.10gb@3"
    share = core.assignment_annotations(
        "ns/f", 1, core.PodAssignment(0, "n1", gpu_indices=(1,), gpu_fraction=0.5), node
    )
    assert share[core.GPU_FRACTION_ANNOTATION] == "0.5"
