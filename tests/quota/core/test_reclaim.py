"""Reclaim victims: the most over-quota queue first, protected queues skipped (KAI-Scheduler#1750)."""

from __future__ import annotations

import pytest

from kumiki.quota.core import ANY_MODEL, Holding, Outcome, Queue, build_config, choose_victims, decide_admission
from tests.quota.core.helpers import request, small_config


def test_victims_come_from_the_most_over_quota_queue_first() -> None:
    config = small_config()
    held = [
        Holding("root/b", 4),
        Holding("root/b", 2, borrowed=True, job_id="b-borrow", generation=1, seq=10),
        Holding("root/batch", 1, borrowed=True, job_id="x1", generation=1, seq=1),
        Holding("root/batch", 1, borrowed=True, job_id="x2", generation=1, seq=2),
        Holding("root/batch", 1, borrowed=True, job_id="x3", generation=1, seq=3),
    ]
    victims, uncovered = choose_victims(config, held, 3, "root/a")
    # batch is 3 over its guarantee, b 2 over: batch loses its latest admission first; then both are 2 over
    # and the latest admission of the two (b's) goes, which covers the need.
    assert [v.job_id for v in victims] == ["x3", "b-borrow"]
    assert uncovered == 0


def test_a_running_borrower_goes_before_a_later_one_not_bound_yet_but_not_across_queues() -> None:
    config = small_config()
    held = [
        Holding("root/b", 4),
        Holding("root/batch", 1, borrowed=True, job_id="running", generation=1, seq=1),
        Holding("root/batch", 1, borrowed=True, job_id="waiting", generation=1, seq=2, running=False),
        Holding("root/b", 1, borrowed=True, job_id="b-running", generation=1, seq=3),
    ]
    # batch is 2 over, b 1 over: batch first; of its two, the running one, though admitted earlier
    victims, _ = choose_victims(config, held, 1, "root/a")
    assert [v.job_id for v in victims] == ["running"]
    # then batch and b are both 1 over: the running one (b's) before the one not bound; the unbound one last
    victims, uncovered = choose_victims(config, held, 3, "root/a")
    assert [v.job_id for v in victims] == ["running", "b-running", "waiting"]
    assert uncovered == 0


def test_guaranteed_work_is_never_a_victim_and_shortfall_is_reported() -> None:
    config = small_config()
    held = [Holding("root/b", 4, job_id="b", generation=1), Holding("root/batch", 1, borrowed=True, job_id="x")]
    victims, uncovered = choose_victims(config, held, 3, "root/a")
    assert [v.job_id for v in victims] == ["x"]
    assert uncovered == pytest.approx(2.0)


def test_kai_1750_reclaim_from_over_quota_sibling_despite_a_protected_lower_priority_queue() -> None:
    """kai-scheduler/KAI-Scheduler#1750: root -> org-parent -> {reclaimer (under its guarantee), batch (over
    its guarantee of 0)}, and an unrelated protected queue (under its guarantee, lower-priority work). Reclaim
    must take batch's borrowed work and never the protected queue's, and must not give up because of it."""
    queues = [
        Queue("org-parent", None, {ANY_MODEL: 6}),
        Queue("org-parent/reclaimer", "org-parent", {ANY_MODEL: 4}),
        Queue("org-parent/batch", "org-parent", {}),
        Queue("protected", None, {ANY_MODEL: 4}),
    ]
    config = build_config(queues, {"gpu": 10.0})
    held = [
        Holding("protected", 3, priority_tier=0, job_id="protected-low", generation=1, seq=1),
        Holding("org-parent/batch", 3, borrowed=True, priority_tier=5, job_id="batch-1", generation=1, seq=2),
        Holding("org-parent/batch", 3, borrowed=True, priority_tier=5, job_id="batch-2", generation=1, seq=3),
    ]
    decision = decide_admission(config, held, request("org-parent/reclaimer", 4, job="pending"))
    assert decision.outcome is Outcome.ADMITTED and decision.shortfall_gpus == pytest.approx(3.0)
    victims, uncovered = choose_victims(config, held, decision.shortfall_gpus, "org-parent/reclaimer")
    assert [v.job_id for v in victims] == ["batch-2"]
    assert uncovered == 0
    # control: the protected queue stays protected even when nothing else could cover the need
    victims, uncovered = choose_victims(config, held[:1], 3, "org-parent/reclaimer")
    assert victims == [] and uncovered == 3


def test_victim_side_within_its_guarantee_at_the_diverging_level_is_protected() -> None:
    # team-x's leaf borrowed beyond its own guarantee, but its parent is within the parent's guarantee:
    # a queue in another organisation cannot take it.
    queues = [
        Queue("org1", None, {ANY_MODEL: 6}),
        Queue("org1/x", "org1", {ANY_MODEL: 2}),
        Queue("org2", None, {ANY_MODEL: 4}),
        Queue("org2/y", "org2", {ANY_MODEL: 4}),
    ]
    config = build_config(queues, {"gpu": 10.0})
    held = [Holding("org1/x", 2), Holding("org1/x", 3, borrowed=True, job_id="x-borrow")]
    assert choose_victims(config, held, 3, "org2/y")[0] == []
    # its sibling under the same organisation can
    config2 = build_config([*queues[:2], Queue("org1/z", "org1", {ANY_MODEL: 4}), *queues[2:]], {"gpu": 10.0})
    assert [v.job_id for v in choose_victims(config2, held, 3, "org1/z")[0]] == ["x-borrow"]
