"""kumiki.telemetry.core.views: what cluster.state carries and when it is published."""

from __future__ import annotations

import pytest

from kumiki.telemetry import core
from tests.telemetry.core.support import feed, hold, inventory, reading


def test_node_view_has_inventory_health_holders_and_free_gpus() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 4)), "n1", "job", (1,))
    record, _, _ = feed(
        record,
        [
            reading("n1", 0, 1000.0, 10.0),
            reading("n1", 1, 1000.0, 80.0),
            reading("n1", 2, 1000.0, 0.0, ecc=2),
            reading("n1", 3, 1000.0, 0.0, xids=(79,)),
        ],
    )
    view = core.node_view(record)
    assert view.healthy
    assert [(g.index, g.healthy, g.allocated_to) for g in view.gpus] == [
        (0, True, ""),
        (1, True, "job"),
        (2, False, ""),
        (3, False, ""),
    ]
    assert view.free_gpus == (0,)
    assert view.labels[core.FREE_GPUS_LABEL] == "0"
    assert [g.nvlink_island for g in view.gpus] == [0, 0, 0, 0]
    assert core.allocated_vs_used(view) == (1, pytest.approx(0.8))


def test_placement_relevant_changes_publish_at_once_utilisation_only_after_the_interval() -> None:
    record, _, _ = feed(core.apply_inventory(None, inventory("n1", 2)), [reading("n1", 0, 1000.0, 10.0)])
    published = core.publish_decision(record, core.node_view(record), 1000.0, 10.0)
    assert published is not None and published.version == 1
    busier, _, _ = feed(published, [reading("n1", 0, 1001.0, 90.0)])
    assert core.publish_decision(busier, core.node_view(busier), 1001.0, 10.0) is None
    assert core.publish_decision(busier, core.node_view(busier), 1010.0, 10.0) is not None
    held = hold(busier, "n1", "job", (1,))
    again = core.publish_decision(held, core.node_view(held), 1001.0, 10.0)
    assert again is not None and again.version == 2


def test_the_view_is_rebuilt_only_when_placement_could_change_or_the_interval_ran_out() -> None:
    record, _, _ = feed(
        core.apply_inventory(None, inventory("n1", 2)), [reading("n1", 0, 1000.0, 10.0), reading("n1", 1, 1000.0, 10.0)]
    )
    published = core.publish_decision(record, core.node_view(record), 1000.0, 10.0)
    assert published is not None
    busier, _, _ = feed(published, [reading("n1", 0, 1001.0, 90.0), reading("n1", 1, 1001.0, 90.0)])
    assert not core.may_need_publication(published, busier, 1001.0, 10.0)
    assert core.may_need_publication(published, busier, 1010.0, 10.0)
    broken, _, _ = feed(published, [reading("n1", 0, 1001.0, 90.0, xids=(79,))])
    assert core.may_need_publication(published, broken, 1001.0, 10.0)
    assert core.may_need_publication(published, hold(busier, "n1", "job", (0,)), 1001.0, 10.0)
    assert core.may_need_publication(published, core.check_stale(busier, 1100.0, 30.0), 1001.0, 10.0)
    assert core.may_need_publication(None, busier, 1001.0, 10.0)
    # Whenever it is False, building the view would not have published either.
    assert core.publish_decision(busier, core.node_view(busier), 1001.0, 10.0) is None
    # A held job's busy stretch grows with every chunk (gpu.busy); placement sees none of it, so neither does this.
    held = hold(busier, "n1", "job", (0,))
    holding = core.publish_decision(held, core.node_view(held), 1001.0, 10.0)
    assert holding is not None
    stretched, _, _ = feed(holding, [reading("n1", 0, 1002.0, 90.0)])
    assert stretched.holdings["job"].stretch_held_s > 0
    assert not core.may_need_publication(holding, stretched, 1002.0, 10.0)
