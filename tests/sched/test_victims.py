"""The victim search (kumiki.sched.victims): which running jobs one node's room comes from, and that looking
changes nothing."""

from __future__ import annotations

from kumiki.sched.jobs import consolidated_gang
from kumiki.sched.reserving import Reservation
from kumiki.sched.victims import choose_victims
from tests.sched.helpers import running_two, view

HOUR = 3600.0
MINUTE = 60.0


def test_the_node_losing_least_is_freed_and_each_victim_says_why_and_what_it_loses() -> None:
    now = 3 * HOUR
    scheduler = running_two({"a": now - MINUTE})  # b has three hours unsaved
    scheduler.submit(view("urgent", 4, priority=1), consolidated_gang("urgent", 4, 4), now=now)
    chosen = choose_victims(scheduler, scheduler.waiting["urgent"], now)
    assert chosen == [("a", MINUTE * 4, MINUTE, "priority")]
    assert set(scheduler.running) == {"a", "b"} and "urgent" in scheduler.waiting  # looking changed nothing
    # a starving job of the same tier may take the room whatever the ranks say
    scheduler.submit(view("starving", 4), consolidated_gang("starving", 4, 4), now=now)
    assert choose_victims(scheduler, scheduler.waiting["starving"], now, force=True) == [
        ("a", MINUTE * 4, MINUTE, "starvation")
    ]
    # not starving, a newcomer of the same tier evicts by rank: with no run time yet it outranks three hours run
    assert choose_victims(scheduler, scheduler.waiting["starving"], now) == [("a", MINUTE * 4, MINUTE, "rank")]
    # and one of a lower tier never takes a higher tier's room, starving or not
    scheduler.submit(view("low", 4, priority=-1), consolidated_gang("low", 4, 4), now=now)
    assert choose_victims(scheduler, scheduler.waiting["low"], now, force=True) == []


def test_only_the_nodes_asked_and_never_a_node_reserved_for_another_job() -> None:
    now = 3 * HOUR
    scheduler = running_two({"a": now - MINUTE})
    scheduler.submit(view("urgent", 4, priority=1), consolidated_gang("urgent", 4, 4), now=now)
    entry = scheduler.waiting["urgent"]
    assert [victim[0] for victim in choose_victims(scheduler, entry, now, nodes=[1])] == ["b"]
    scheduler.reservation = Reservation("someone", frozenset({0}), shadow_s=now + HOUR)
    assert [victim[0] for victim in choose_victims(scheduler, entry, now)] == ["b"]
    scheduler.reservation = Reservation("urgent", frozenset({0}), shadow_s=now + HOUR)  # its own: usable
    assert [victim[0] for victim in choose_victims(scheduler, entry, now)] == ["a"]


def test_a_gang_over_several_nodes_evicts_only_when_starving_and_then_clears_as_many_nodes_as_it_needs() -> None:
    now = 3 * HOUR
    scheduler = running_two({"a": now - MINUTE, "b": now - MINUTE})
    scheduler.submit(view("wide", 8, priority=1), consolidated_gang("wide", 8, 4), now=now)
    entry = scheduler.waiting["wide"]
    # a higher tier alone gets a reservation, not a preemption cascade
    assert choose_victims(scheduler, entry, now) == []
    # starving, it stops waiting: both nodes are cleared, each victim saying what it loses
    assert sorted(choose_victims(scheduler, entry, now, force=True)) == [
        ("a", MINUTE * 4, MINUTE, "starvation"),
        ("b", MINUTE * 4, MINUTE, "starvation"),
    ]
    # a lower tier's gang, starving or not, may evict neither job: no node can be cleared, so nothing is evicted
    scheduler.submit(view("low", 8, priority=-1), consolidated_gang("low", 8, 4), now=now)
    assert choose_victims(scheduler, scheduler.waiting["low"], now, force=True) == []
