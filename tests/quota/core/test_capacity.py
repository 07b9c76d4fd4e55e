"""What quota lends shrinks to the GPUs the cluster can run work on now, and never grows past the queue file."""

from __future__ import annotations

import pytest

from kumiki.quota.core import ANY_MODEL, Holding, Outcome, decide_admission, effective_capacity, with_live_capacity
from tests.quota.core.helpers import request, small_config


def test_live_capacity_only_lowers_the_files() -> None:
    configured = {"A100": 64.0, "H100": 32.0}
    assert effective_capacity(configured, None) == configured  # no node seen yet: the file alone
    live = {"A100": 56.0, "H100": 40.0, "L4": 8.0, ANY_MODEL: 104.0}
    # an A100 node down lowers A100; more H100s than the file counts are not quota's to lend; L4 is not in it
    assert effective_capacity(configured, live) == {"A100": 56.0, "H100": 32.0}
    assert effective_capacity(configured, {ANY_MODEL: 0.0}) == {"A100": 0.0, "H100": 0.0}  # nodes seen, none up


def test_any_model_capacity_follows_the_live_total_and_gives_way_first() -> None:
    assert effective_capacity({ANY_MODEL: 128.0}, {"V100": 120.0, ANY_MODEL: 120.0}) == {ANY_MODEL: 120.0}
    # 64 A100 by name plus 32 of any model, with the non-A100 nodes gone: the 32 are not there to lend
    configured = {"A100": 64.0, ANY_MODEL: 32.0}
    assert effective_capacity(configured, {"A100": 64.0, "B": 32.0, ANY_MODEL: 96.0}) == configured
    assert effective_capacity(configured, {"A100": 64.0, ANY_MODEL: 64.0}) == {"A100": 64.0, ANY_MODEL: 0.0}
    assert effective_capacity(configured, {"A100": 60.0, ANY_MODEL: 70.0}) == {"A100": 60.0, ANY_MODEL: 10.0}


def test_a_failed_node_stops_borrowing_but_not_the_guarantee() -> None:
    config = small_config()  # 10 GPUs of model "gpu"; a and b guaranteed 4 each, batch borrows
    holdings = [Holding("root/batch", 2.0, ANY_MODEL, borrowed=True)]
    borrow = request("root/batch", 4, preemptible=True, job="more")
    assert decide_admission(config, holdings, borrow).outcome is Outcome.BORROWED
    shrunk = with_live_capacity(config, {"gpu": 5.0, ANY_MODEL: 5.0})  # half the nodes failed
    assert shrunk.capacity_gpus == {"gpu": 5.0}
    denied = decide_admission(shrunk, holdings, borrow)
    assert denied.outcome is Outcome.DENIED and denied.code == "insufficient_gpus"
    guaranteed = decide_admission(shrunk, holdings, request("root/a", 4, job="owned"))
    assert guaranteed.outcome is Outcome.ADMITTED  # a guarantee is kept; reclaim covers what it can


def test_no_node_seen_leaves_the_configuration_itself() -> None:
    config = small_config()
    assert with_live_capacity(config, None) is config
    assert with_live_capacity(config, {"gpu": 12.0, ANY_MODEL: 12.0}) is config  # more nodes than counted


@pytest.mark.parametrize("live", [{ANY_MODEL: 3.0}, {"gpu": 3.0, ANY_MODEL: 3.0}])
def test_capacity_is_never_negative_or_above_the_live_total(live: dict[str, float]) -> None:
    effective = effective_capacity({"gpu": 10.0}, live)
    assert 0.0 <= sum(effective.values()) <= live[ANY_MODEL]
