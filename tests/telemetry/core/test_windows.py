"""kumiki.telemetry.core.windows: window aggregates and node windows merge as sums, old stored forms too."""

from __future__ import annotations

from kumiki.telemetry import core
from tests.telemetry.core.support import reading


def test_window_aggregates_merge_as_sums() -> None:
    a = core.WindowAggregate(2, 2, 30.0, 20.0, 10.0, 1.5, 10.0)
    b = core.WindowAggregate(1, 1, 90.0, 90.0, 5.0, 4.5, 0.0)
    merged = core.WindowAggregate.from_json(core.merge_json(a.to_json(), b.to_json()))
    assert merged == core.WindowAggregate(3, 3, 120.0, 90.0, 15.0, 6.0, 10.0)
    assert merged.mean_util_pct == 40.0
    assert core.merge_json({}, b.to_json()) == b.to_json()


def test_node_windows_merge_chunks_and_windows_stored_as_objects() -> None:
    (first,) = core.summarise([reading("n1", 0, 100.0, 20.0), reading("n1", 1, 100.0, 60.0)], 60.0)
    (second,) = core.summarise([reading("n1", 0, 110.0, 40.0)], 60.0)
    merged = core.merge_node_window(core.merge_node_window(None, core.node_window(first)), core.node_window(second))
    node = core.WindowAggregate.from_json(merged["node"])
    assert (node.samples, node.mean_util_pct, node.util_max) == (3, 40.0, 60.0)
    assert core.WindowAggregate.from_json(merged["gpus"]["GPU-n1-0"]).mean_util_pct == 30.0
    old_form = {
        "node": core.WindowAggregate(1, 1, 10.0, 10.0).to_json(),
        "gpus": {"GPU-n1-0": core.WindowAggregate(1, 1, 10.0, 10.0).to_json()},
    }
    again = core.merge_node_window(old_form, core.node_window(second))
    assert core.WindowAggregate.from_json(again["gpus"]["GPU-n1-0"]).mean_util_pct == 25.0
