"""The node-records codec writes exactly what faust's JSON codec writes, and reads it back."""

from __future__ import annotations

from faust.serializers import codecs

from kumiki.telemetry import core
from kumiki.telemetry.adapters.codecs import NodeRecordJson
from kumiki.telemetry.core import Inventory, InventoryGpu, NodeRecord, Reading


def record() -> NodeRecord:
    gpus = tuple(
        InventoryGpu(i, f"GPU-{i}", "NVIDIA A100-SXM4-80GB", 81920, 0, i == 1, ("1g.10gb@0",) * i) for i in range(3)
    )
    node = core.apply_inventory(None, Inventory("n1", gpus, 64000, 512000, "r1", {"kumiki.dev/pcie-0-1": "PIX"}))
    node = core.apply_allocation(node, core.AllocationChange("n1", "job-1", 2, "research", (0, 2), True))
    readings = [
        Reading("n1", f"GPU-{i}", i, None, 1000.0 + tick, 3.0 * i, 1024, 81920, 0, (), "NVIDIA A100-SXM4-80GB")
        for tick in range(3)
        for i in range(3)
    ]
    (chunk,) = core.summarise(readings, 60.0)
    node, _, _ = core.apply_chunk(node, chunk, core.TelemetryConfig())
    return node


def test_the_same_bytes_as_fausts_json_codec_and_the_same_record_back() -> None:
    value = record()
    assert len(value.gpus) == 3 and value.holdings and value.inventory is not None
    written = NodeRecordJson().dumps(value)
    assert written == codecs.get_codec("json").dumps(value)
    assert NodeRecord.from_json(NodeRecordJson().loads(written)) == value
    assert NodeRecordJson().loads(written) == codecs.get_codec("json").loads(written)


def test_a_changed_inventory_is_written_anew_not_from_the_rendered_one() -> None:
    codec = NodeRecordJson()
    first = record()
    assert codec.dumps(first) == codec.dumps(first) == codecs.get_codec("json").dumps(first)  # reused
    assert first.inventory is not None
    moved = core.apply_inventory(first, Inventory("n1", first.inventory.gpus[:1], rack="r2"))
    written = codec.dumps(moved)
    assert written == codecs.get_codec("json").dumps(moved)
    assert NodeRecord.from_json(codec.loads(written)) == moved
    assert written != codec.dumps(first) == codecs.get_codec("json").dumps(first)  # each its own inventory
