"""Admission: inside the guarantee, borrowing beyond it, limits, tiers and who may submit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.quota.core import (
    ANY_MODEL,
    Holding,
    Outcome,
    Queue,
    decide_admission,
    guarantee_headroom,
    may_submit,
    parse_config,
)
from tests.quota.core.helpers import example, request, small_config


def test_owners_of_an_ancestor_may_submit() -> None:
    config = parse_config(example())
    assert may_submit(config, "alice", "acme/research/vision")
    assert may_submit(config, "research-leads", "acme/research/vision")
    assert not may_submit(config, "carol", "acme/research/vision")


def test_inside_the_guarantee_is_admitted_without_borrowing() -> None:
    config = small_config()
    decision = decide_admission(config, [Holding("root/a", 1)], request("root/a", 3))
    assert decision.outcome is Outcome.ADMITTED and decision.shortfall_gpus == 0


def test_beyond_the_guarantee_only_preemptible_work_borrows_idle_gpus() -> None:
    config = small_config()
    held = [Holding("root/a", 4)]
    assert decide_admission(config, held, request("root/a", 2)).code == "quota_exceeded"
    borrowed = decide_admission(config, held, request("root/a", 6, preemptible=True))
    assert borrowed.outcome is Outcome.BORROWED
    denied = decide_admission(config, held, request("root/a", 7, preemptible=True))
    assert denied.code == "insufficient_gpus" and "6 idle" in denied.message


def test_low_tier_borrows_every_idle_gpu_while_nobody_needs_them() -> None:
    config = small_config()
    held: list[Holding] = []
    for index in range(10):
        decision = decide_admission(config, held, request("root/batch", 1, preemptible=True, job=f"b{index}"))
        assert decision.outcome is Outcome.BORROWED
        held.append(Holding("root/batch", 1, borrowed=True, job_id=f"b{index}"))
    assert decide_admission(config, held, request("root/batch", 1, preemptible=True)).code == "insufficient_gpus"


def test_guaranteed_work_is_admitted_when_lent_out_and_names_the_shortfall() -> None:
    config = small_config()
    held = [Holding("root/batch", 9, borrowed=True)]
    decision = decide_admission(config, held, request("root/a", 3))
    assert decision.outcome is Outcome.ADMITTED
    assert decision.shortfall_gpus == pytest.approx(2.0)


def test_limit_caps_the_subtree_including_borrowed_work() -> None:
    config = small_config()
    held = [Holding("root/b", 4), Holding("root/b", 1, borrowed=True)]
    decision = decide_admission(config, held, request("root/b", 2, preemptible=True))
    assert decision.code == "limit_exceeded" and "queue root/b" in decision.message and "limit of 6" in decision.message


def test_tier_and_leaf_and_unknown_queue_are_denied_with_reasons() -> None:
    config = small_config(priority_tiers=frozenset({0}))
    assert decide_admission(config, [], request("root/batch", 1, preemptible=True, tier=3)).code == "tier_not_allowed"
    assert decide_admission(config, [], request("root", 1)).code == "queue_not_leaf"
    assert decide_admission(config, [], request("nope", 1)).code == "unknown_queue"


def test_guarantee_per_model_spills_into_the_any_model_guarantee() -> None:
    queue = Queue("q", None, {"A100": 4, ANY_MODEL: 2})
    assert guarantee_headroom(queue, {}, "A100") == 6
    assert guarantee_headroom(queue, {"A100": 5}, "A100") == 1
    assert guarantee_headroom(queue, {"A100": 5}, "H100") == 1
    assert guarantee_headroom(queue, {"H100": 2}, "A100") == 4
    assert guarantee_headroom(queue, {ANY_MODEL: 3}, "A100") == 3


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["root/a", "root/b", "root/batch"]), st.integers(1, 4), st.booleans()), max_size=30
    )
)
def test_admissions_never_break_limits_and_borrowing_never_exceeds_capacity(steps: list[tuple[str, int, bool]]) -> None:
    config = small_config()
    held: list[Holding] = []
    for index, (queue, gpus, preemptible) in enumerate(steps):
        decision = decide_admission(config, held, request(queue, gpus, preemptible=preemptible, job=f"j{index}"))
        if decision.admitted:
            held.append(Holding(queue, gpus, borrowed=decision.outcome is Outcome.BORROWED, job_id=f"j{index}"))
        assert sum(h.gpus for h in held if h.queue == "root/b") <= 6
        guaranteed = sum(h.gpus for h in held if not h.borrowed)
        assert guaranteed <= 8  # the sum of guarantees
        if decision.outcome is Outcome.BORROWED:
            assert sum(h.gpus for h in held) <= 10
