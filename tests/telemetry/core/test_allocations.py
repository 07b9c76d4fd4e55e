"""kumiki.telemetry.core.allocations: job.lifecycle transitions to per-node allocation changes."""

from __future__ import annotations

from kumiki.telemetry import core
from kumiki.telemetry.core import Assignment, Transition
from tests.telemetry.core.support import hold


def transition(state: int, generation: int = 1, *assignments: Assignment) -> Transition:
    return Transition("job-1", generation, state, "q", assignments)


def test_bound_then_moved_then_completed_releases_every_node_it_held() -> None:
    placement, changes = core.allocation_changes(
        None, transition(core.STATE_BOUND, 1, Assignment("n1", (0, 1)), Assignment("n2", (3,)))
    )
    assert [(c.node, c.gpu_indices, c.holding) for c in changes] == [("n1", (0, 1), True), ("n2", (3,), True)]
    placement, changes = core.allocation_changes(placement, transition(core.STATE_RUNNING, 1, Assignment("n1", (0, 1))))
    assert [(c.node, c.holding) for c in changes] == [("n1", True), ("n2", False)]
    placement, changes = core.allocation_changes(placement, transition(core.STATE_COMPLETED, 1))
    assert [(c.node, c.holding) for c in changes] == [("n1", False)]
    assert placement is not None and placement.ended


def test_an_older_generation_or_a_late_running_after_completion_changes_nothing() -> None:
    placement, _ = core.allocation_changes(None, transition(core.STATE_RUNNING, 2, Assignment("n1", (0,))))
    kept, changes = core.allocation_changes(placement, transition(core.STATE_FAILED, 1))
    assert (kept, changes) == (placement, [])
    ended, _ = core.allocation_changes(placement, transition(core.STATE_PREEMPTED, 2))
    again, changes = core.allocation_changes(ended, transition(core.STATE_RUNNING, 2, Assignment("n1", (0,))))
    assert (again, changes) == (ended, [])
    record = hold(None, "n1", "job-1", (0,), generation=3)
    assert core.apply_allocation(record, core.AllocationChange("n1", "job-1", 2, "q", (), False)) == record
