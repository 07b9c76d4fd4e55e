"""JSON-lines sink and recordings: what is written reads back equal, and bad files are named."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kumiki.agent.adapters.jsonl import (
    FanOutSink,
    JsonLinesSink,
    RecordingSink,
    read_recording,
)
from kumiki.agent.core import GpuDevice, GpuInventory, GpuSample, RecordError, SampleFields

INVENTORY = GpuInventory(
    node="node-a",
    collected_at=100.0,
    driver_version="550.54.15",
    cuda_driver_version="12.4",
    gpus=(GpuDevice(0, "GPU-0", "NVIDIA L4", 24 * 1024**3, "00000000:07:00.0", None),),
)


def samples(timestamp: float) -> list[GpuSample]:
    return [
        GpuSample("node-a", "GPU-0", 0, None, timestamp, SampleFields(gpu_util_pct=12.0, power_w=None)),
        GpuSample(
            "node-a",
            "GPU-0",
            0,
            3,
            timestamp,
            SampleFields(memory_used_bytes=5),
            labels={"pod": "p-0", "namespace": "ns"},
        ),
    ]


async def test_json_lines_are_one_inventory_then_one_sample_per_line() -> None:
    stream = io.StringIO()
    sink = JsonLinesSink(stream)
    await sink.publish_inventory(INVENTORY)
    await sink.publish(samples(101.0))
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["kind"] for line in lines] == ["inventory", "sample", "sample"]
    assert lines[1]["fields"] == {"gpu_util_pct": 12.0}  # power unset: absent, not null
    assert lines[2]["labels"] == {"pod": "p-0", "namespace": "ns"}


async def test_a_recording_reads_back_equal(tmp_path: Path) -> None:
    recording = RecordingSink(tmp_path / "rec")
    recording.start()
    fan_out = FanOutSink([recording, JsonLinesSink(io.StringIO())])
    await fan_out.publish_inventory(INVENTORY)
    await fan_out.publish(samples(101.0))
    await fan_out.publish(samples(102.0))
    recording.write_summary({"ticks": 2})
    await fan_out.close()
    inventory, recorded = read_recording(tmp_path / "rec")
    assert inventory == INVENTORY
    assert recorded == samples(101.0) + samples(102.0)
    assert json.loads((tmp_path / "rec" / "summary.json").read_text())["ticks"] == 2


async def test_recording_refuses_to_overwrite(tmp_path: Path) -> None:
    first = RecordingSink(tmp_path)
    first.start()
    await first.publish_inventory(INVENTORY)
    await first.close()
    with pytest.raises(FileExistsError, match=r"inventory\.json exists"):
        RecordingSink(tmp_path).start()


async def test_bad_recordings_name_file_line_and_field(tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"inventory\.json: missing"):
        read_recording(tmp_path)
    recording = RecordingSink(tmp_path)
    recording.start()
    await recording.publish_inventory(INVENTORY)
    await recording.publish(samples(101.0))
    await recording.close()
    path = tmp_path / "samples.jsonl"
    lines = path.read_text().splitlines()
    broken = json.loads(lines[1])
    broken["fields"]["memory_used_bytes"] = "five"
    path.write_text("\n".join([lines[0], json.dumps(broken), "{not json"]) + "\n")
    with pytest.raises(RecordError, match=r"samples\.jsonl:2: fields\.memory_used_bytes: expected int"):
        read_recording(tmp_path)
    path.write_text("\n".join([lines[0], "{not json"]) + "\n")
    with pytest.raises(RecordError, match=r"samples\.jsonl:2: not JSON"):
        read_recording(tmp_path)
