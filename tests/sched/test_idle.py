"""kumiki.sched.idle: idle-reclaim rules per queue, pure; the option's text parsed, and a bad entry named."""

from __future__ import annotations

import dataclasses

import pytest

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.idle import IdlePolicy, WaitingFor, idle_victims, parse_idle_reclaim, rule_for, waiting_for_gpus
from kumiki.sched.jobs import consolidated_gang
from kumiki.sched.policies import POLICIES, admission_rank
from kumiki.sched.scheduler import Scheduler
from tests.sched.helpers import view


def test_idle_reclaim_rules_parse_and_name_the_bad_entry() -> None:
    rules = parse_idle_reclaim("team=waiting:600, batch=after:1800, *=never")
    assert rules == {"team": IdlePolicy("waiting", 600.0), "batch": IdlePolicy("after", 1800.0), "*": IdlePolicy()}
    for bad in ("team=sometimes", "team=after:soon", "=after:1", "team=after:-5"):
        with pytest.raises(ValueError, match=bad.split(",")[0].replace("*", r"\*")):
            parse_idle_reclaim(bad)


def test_a_queue_without_its_own_rule_takes_the_star_rule_else_never() -> None:
    rules = parse_idle_reclaim("team=after:60, *=waiting:0")
    assert rule_for(rules, "team") == IdlePolicy("after", 60.0)
    assert rule_for(rules, "other") == IdlePolicy("waiting", 0.0)
    assert rule_for(parse_idle_reclaim("team=after:60"), "other") == IdlePolicy()


@pytest.mark.parametrize(
    ("rule", "idle_for_s", "waiting", "reclaimed"),
    [
        (IdlePolicy(), 1e9, True, False),  # never, however long and whoever waits
        (IdlePolicy("after", 600.0), 599.0, True, False),  # not idle long enough
        (IdlePolicy("after", 600.0), 600.0, False, True),  # after: nobody needs to wait
        (IdlePolicy("waiting", 600.0), 900.0, False, False),  # waiting: only for someone
        (IdlePolicy("waiting", 600.0), 900.0, True, True),
        (IdlePolicy("waiting", 600.0), 300.0, True, False),
    ],
)
def test_a_rule_reclaims_past_its_time_and_under_waiting_only_for_someone(
    rule: IdlePolicy, idle_for_s: float, waiting: bool, reclaimed: bool
) -> None:
    assert rule.reclaims(idle_for_s, waiting) is reclaimed
    assert rule.may_reclaim(idle_for_s) is (rule.mode != "never" and idle_for_s >= rule.idle_s)


def cluster(layout: dict[str, int], nodes: int = 2, gpus: int = 8) -> Scheduler:
    """`layout` started in order under `fifo` (best-fit): job -> GPUs."""
    scheduler = Scheduler(POLICIES["fifo"], ClusterState.empty(uniform_cluster(nodes, gpus)), "best-fit")
    for job_id, count in layout.items():
        scheduler.submit(view(job_id, count), consolidated_gang(job_id, count, gpus))
        assert [start.job_id for start in scheduler.schedule(0.0).starts] == [job_id]
    return scheduler


def waiting_for(*jobs: tuple[str, int], held: bool = False) -> list[WaitingFor]:
    return [(job_id, consolidated_gang(job_id, count, 8), held) for job_id, count in jobs]


WAITING = parse_idle_reclaim("*=waiting:0")


def test_a_zombie_is_reclaimed_only_for_a_job_its_gpus_let_start() -> None:
    scheduler = cluster({"filler": 8, "busy": 7, "zombie": 1})  # both nodes full
    idle = [("zombie", "q", 900.0)]
    gang = waiting_for(("gang", 8))
    assert idle_victims(scheduler, idle, WAITING, lambda: gang) == []  # one GPU of a full node: no room for 8
    small = waiting_for(("gang", 8), ("small", 1))
    assert idle_victims(scheduler, idle, WAITING, lambda: small) == [("zombie", "small")]
    assert idle_victims(scheduler, idle, parse_idle_reclaim("*=after:600"), lambda: []) == [("zombie", "")]
    assert idle_victims(scheduler, idle, parse_idle_reclaim("*=after:1000"), lambda: small) == []


def test_zombies_that_make_room_together_are_reclaimed_together_and_one_job_takes_the_fewest() -> None:
    together = cluster({"filler": 8, "z1": 4, "z2": 4})
    idle = [("z1", "q", 900.0), ("z2", "q", 900.0)]
    node = waiting_for(("node", 8))
    assert sorted(idle_victims(together, idle, WAITING, lambda: node)) == [("z1", "node"), ("z2", "node")]
    apart = cluster({"z1": 4, "x": 4, "z2": 4, "y": 4})
    apart.finished("x")
    apart.finished("y")  # each node: a zombie and 4 free GPUs
    assert [apart.state.free_count(n) for n in (0, 1)] == [4, 4]
    assert idle_victims(apart, idle, WAITING, lambda: node) == [("z1", "node")]


def test_a_queued_job_that_fits_already_waits_for_its_turn_but_a_held_one_for_quota() -> None:
    scheduler = cluster({"filler": 8, "zombie": 4})  # 4 GPUs free
    idle = [("zombie", "q", 900.0)]
    assert idle_victims(scheduler, idle, WAITING, lambda: waiting_for(("four", 4))) == []
    held = waiting_for(("four", 4), held=True)
    assert idle_victims(scheduler, idle, WAITING, lambda: held) == [("zombie", "four")]


def test_no_idle_job_is_reclaimed_for_a_job_idle_reclaim_evicted_that_has_not_computed_since() -> None:
    # it would hold the GPUs idle in turn, and the job it displaced would wait to do the same: a chain of evictions
    scheduler = cluster({"filler": 8, "busy": 7, "zombie": 1})  # both nodes full
    idle = [("zombie", "q", 900.0)]
    was_idle = dataclasses.replace(view("was-idle", 1), idle_reclaims=1)
    scheduler.submit(was_idle, consolidated_gang("was-idle", 1, 8))
    assert scheduler.schedule(0.0).starts == []

    def waiting(*held: tuple[str, int, bool]) -> list[WaitingFor]:
        return list(waiting_for_gpus(scheduler, [(job, consolidated_gang(job, n, 8), d) for job, n, d in held]))

    assert [job for job, _, _ in waiting()] == []  # queued, demoted: skipped
    assert idle_victims(scheduler, idle, WAITING, waiting) == []
    assert idle_victims(scheduler, idle, WAITING, lambda: waiting(("held-was-idle", 1, True))) == []
    assert idle_victims(scheduler, idle, WAITING, lambda: waiting(("held", 1, False))) == [("zombie", "held")]
    scheduler.submit(dataclasses.replace(view("fresh", 1), submit_s=5.0), consolidated_gang("fresh", 1, 8))
    assert [job for job, _, _ in waiting()] == ["fresh"]
    assert idle_victims(scheduler, idle, WAITING, waiting) == [("zombie", "fresh")]


def test_a_gang_over_several_nodes_counts_the_nodes_free_already() -> None:
    scheduler = cluster({"zombie": 8, "busy": 8}, nodes=3)  # node 2 is free
    idle = [("zombie", "q", 900.0)]
    assert idle_victims(scheduler, idle, WAITING, lambda: waiting_for(("two", 16))) == [("zombie", "two")]
    assert idle_victims(scheduler, idle, WAITING, lambda: waiting_for(("three", 24))) == []


def test_a_job_idle_reclaim_evicted_waits_behind_its_tier_but_ahead_of_lower_tiers() -> None:
    scheduler = Scheduler(POLICIES["fifo"], ClusterState.empty(uniform_cluster(1, 8)), "best-fit")
    jobs = {
        "zombie": dataclasses.replace(view("zombie", 8), idle_reclaims=1),  # the oldest: FIFO put it first
        "newer": dataclasses.replace(view("newer", 8), submit_s=50.0),
        "low": dataclasses.replace(view("low", 8, priority=-1), submit_s=10.0),
        "high-zombie": dataclasses.replace(view("high-zombie", 8, priority=1), submit_s=90.0, idle_reclaims=2),
    }
    for job in jobs.values():
        scheduler.submit(job, consolidated_gang(job.job_id, 8, 8))
    started = []
    while scheduler.waiting:
        (start,) = scheduler.schedule(0.0).starts
        started.append(start.job_id)
        scheduler.finished(start.job_id)
    assert started == ["high-zombie", "newer", "zombie", "low"]
    held = {name: admission_rank(POLICIES["fifo"], job, 0.0, 0.0) for name, job in jobs.items()}
    assert sorted(held, key=held.__getitem__) == started  # quota's admission order agrees
