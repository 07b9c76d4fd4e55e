"""Commit progress, pure: lag alone is no stall; records behind a committed offset that stopped moving are."""

from __future__ import annotations

from kumiki.common.bus import progress
from kumiki.common.bus.progress import PartitionProgress


def test_a_committed_offset_that_keeps_moving_is_never_stalled_however_far_behind() -> None:
    state: dict[str, PartitionProgress] = {}
    for second in range(0, 600, 10):
        state = progress.advance(state, {"p": second}, {"p": second + 10_000}, float(second))
        assert progress.stalled(state, float(second), 60) == {}
    assert state["p"].behind == 10_000


def test_records_behind_an_unmoving_committed_offset_stall_after_the_limit_and_not_before() -> None:
    state = progress.advance({}, {"p": 5}, {"p": 5}, 0.0)  # caught up
    state = progress.advance(state, {"p": 5}, {"p": 9}, 10.0)  # four records arrive and are not committed
    state = progress.advance(state, {"p": 5}, {"p": 9}, 69.0)
    assert progress.stalled(state, 69.0, 60) == {}  # they wait since the look at 10 s, not since 0 s
    assert set(progress.stalled(state, 70.0, 60)) == {"p"}
    state = progress.advance({}, {"p": 5}, {"p": 9}, 100.0)  # first look: the clock starts now
    state = progress.advance(state, {"p": 5}, {"p": 9}, 159.0)
    assert progress.stalled(state, 159.0, 60) == {}
    assert progress.oldest_wait_s(state, 159.0) == 59.0
    state = progress.advance(state, {"p": 5}, {"p": 12}, 160.0)  # more records do not restart the clock
    assert set(progress.stalled(state, 160.0, 60)) == {"p"}
    assert progress.stalled(state, 160.0, 60)["p"].behind == 7


def test_a_commit_or_catching_up_restarts_the_clock_and_a_partition_gone_is_forgotten() -> None:
    state = progress.advance({}, {"a": 1, "b": 0}, {"a": 4, "b": 3}, 0.0)
    state = progress.advance(state, {"a": 2, "b": 0}, {"a": 4, "b": 3}, 50.0)  # a moved, b did not
    state = progress.advance(state, {"a": 2, "b": 0}, {"a": 4, "b": 3}, 80.0)
    assert set(progress.stalled(state, 80.0, 60)) == {"b"}
    state = progress.advance(state, {"a": 4}, {"a": 4}, 200.0)  # b moved to another worker; a caught up
    assert set(state) == {"a"} and progress.stalled(state, 500.0, 60) == {}
    assert progress.oldest_wait_s(state, 500.0) == 0.0


def test_a_group_that_never_committed_counts_from_the_earliest_record() -> None:
    state = progress.advance({}, {}, {"p": 3}, 0.0)
    assert state["p"] == PartitionProgress(0, 3, 0.0)
    state = progress.advance(state, {"p": -1}, {"p": 3}, 61.0)  # the broker's "no offset" reads as -1
    assert state["p"].committed == 0 and set(progress.stalled(state, 61.0, 60)) == {"p"}
