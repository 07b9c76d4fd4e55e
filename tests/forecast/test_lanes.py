"""Key lanes: each key level's last `window` started jobs, a job kept while any lane holds it."""

from __future__ import annotations

from dataclasses import dataclass

from kumiki.forecast.models.history import Key
from kumiki.forecast.models.lanes import KeyLanes

WIDE: Key = ("q", "vc")
NARROW: Key = ("qg", "vc", "8")


@dataclass
class _Job:
    name: str
    lanes: int = 0


def test_a_full_lane_lets_its_oldest_go_and_a_job_is_forgotten_only_when_no_lane_holds_it() -> None:
    lanes: KeyLanes[_Job] = KeyLanes(window=2)
    told: list[tuple[Key, str, int]] = []

    def leaving(key: Key, job_id: str, job: _Job) -> None:
        told.append((key, job_id, job.lanes))

    lanes.enter("a", _Job("a"), (NARROW, WIDE), leaving)
    lanes.enter("b", _Job("b"), (WIDE,), leaving)
    lanes.enter("c", _Job("c"), (WIDE,), leaving)  # WIDE is full: "a" leaves it, and NARROW still holds "a"

    assert told == [(WIDE, "a", 2)]  # told before its count drops
    assert list(lanes.lanes[WIDE]) == ["b", "c"] and list(lanes.lanes[NARROW]) == ["a"]
    assert lanes.members["a"].lanes == 1 and lanes.size(WIDE) == 2 and lanes.size(("q", "other")) == 0

    lanes.enter("d", _Job("d"), (NARROW,), leaving)
    lanes.enter("e", _Job("e"), (NARROW,), leaving)  # NARROW is full: "a" leaves its last lane

    assert told[-1] == (NARROW, "a", 1)
    assert "a" not in lanes.members and sorted(lanes.members) == ["b", "c", "d", "e"]


def test_entering_returns_the_member_it_keeps_and_counts_each_lane() -> None:
    lanes: KeyLanes[_Job] = KeyLanes(window=5)
    job = lanes.enter("a", _Job("a"), (NARROW, WIDE))

    assert lanes.members["a"] is job and job.lanes == 2
