"""kumiki.telemetry.core.records: the node record's staleness and its changelog JSON (faust's codecs, old forms)."""

from __future__ import annotations

import json

import pytest

from kumiki.telemetry import core
from kumiki.telemetry.core import NodeRecord
from tests.telemetry.core.support import feed, hold, inventory, reading


def test_a_silent_node_turns_stale_and_recovers_with_its_next_sample() -> None:
    record, _, _ = feed(core.apply_inventory(None, inventory("n1", 1)), [reading("n1", 0, 1000.0, 10.0)])
    assert core.check_stale(record, 1030.0, 30.0) is record
    stale = core.check_stale(record, 1030.5, 30.0)
    assert stale.stale and not core.node_view(stale).healthy
    back, _, _ = feed(stale, [reading("n1", 0, 1031.0, 10.0)])
    assert core.node_view(back).healthy


def test_a_node_record_survives_its_json_round_trip() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    for t in range(0, 80, 10):
        record, _, _ = feed(record, [reading("n1", 0, 1000.0 + t, 1.0), reading("n1", 1, 1000.0 + t, 1.0)])
    assert any(h.reported_since is not None for h in record.holdings.values())
    assert NodeRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_faust_codecs_write_the_same_node_record_json_with_orjson_or_json() -> None:
    from faust.utils import json as faust_json

    orjson = pytest.importorskip("orjson")
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    record, _, _ = feed(record, [reading("n1", 0, 1000.0, 1.0), reading("n1", 1, 1000.0, 1.0)])
    native = orjson.loads(orjson.dumps(record, default=faust_json.on_default))  # faust's orjson path
    standard = json.loads(json.dumps(record, default=lambda value: value.__json__()))  # its json path
    assert native == standard == json.loads(json.dumps(record.to_json()))
    assert NodeRecord.from_json(native) == record


def test_a_node_record_written_before_the_compact_form_is_still_restored() -> None:
    record, _, _ = feed(core.apply_inventory(None, inventory("n1", 1)), [reading("n1", 0, 1000.0, 42.0)])
    data = json.loads(json.dumps(record.to_json()))
    ((uuid, gpu),) = data["gpus"].items()
    names = [
        "index",
        "model",
        "last_ts",
        "utilization_pct",
        "memory_total_mib",
        "healthy",
        "idle_since",
        "idle_util_sum",
        "idle_util_n",
    ]
    data["gpus"][uuid] = dict(zip(names, gpu, strict=True))  # the object form of the previous changelog
    assert NodeRecord.from_json(data) == record
