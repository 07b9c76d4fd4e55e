"""JSON-lines sinks and recordings: the agent's output until the Kafka publisher is wired, and the
fixture format for replaying a node (inventory.json + samples.jsonl + summary.json in a folder)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from kumiki.agent.core import (
    GpuInventory,
    GpuSample,
    RecordError,
    inventory_from_dict,
    inventory_to_dict,
    sample_from_dict,
    sample_to_dict,
)

INVENTORY_FILE = "inventory.json"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"


def _dumps(record: dict[str, Any]) -> str:
    # allow_nan=False: a NaN would make a line that strict JSON readers reject downstream.
    return json.dumps(record, separators=(",", ":"), allow_nan=False)


class JsonLinesSink:
    """One JSON object per line: the inventory first (kind=inventory), then samples (kind=sample)."""

    def __init__(self, stream: TextIO, *, owns_stream: bool = False) -> None:
        self._stream = stream
        self._owns_stream = owns_stream

    @classmethod
    def open(cls, target: str) -> JsonLinesSink:
        """'-' is stdout; anything else a file, appended to so a restart does not erase history."""
        if target == "-":
            return cls(sys.stdout)
        return cls(open(target, "a", encoding="utf-8"), owns_stream=True)

    async def publish_inventory(self, inventory: GpuInventory) -> None:
        self._stream.write(_dumps(inventory_to_dict(inventory)) + "\n")
        self._stream.flush()

    async def publish(self, samples: Sequence[GpuSample]) -> None:
        self._stream.write("".join(_dumps(sample_to_dict(sample)) + "\n" for sample in samples))
        self._stream.flush()

    async def close(self) -> None:
        if self._owns_stream:
            self._stream.close()


class RecordingSink:
    """Writes a recording folder that `read_recording` and `--replay` read back."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._samples: TextIO | None = None

    def start(self) -> None:
        """Refuse to overwrite an earlier recording: fixtures are kept, not clobbered."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for name in (INVENTORY_FILE, SAMPLES_FILE):
            if (self.folder / name).exists():
                raise FileExistsError(f"{self.folder / name} exists; record into an empty folder")
        self._samples = open(self.folder / SAMPLES_FILE, "w", encoding="utf-8")  # noqa: SIM115

    async def publish_inventory(self, inventory: GpuInventory) -> None:
        text = json.dumps(inventory_to_dict(inventory), indent=2, allow_nan=False)
        (self.folder / INVENTORY_FILE).write_text(text + "\n", encoding="utf-8")

    async def publish(self, samples: Sequence[GpuSample]) -> None:
        if self._samples is None:
            raise RuntimeError("RecordingSink.publish before start")
        self._samples.write("".join(_dumps(sample_to_dict(sample)) + "\n" for sample in samples))
        self._samples.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        text = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False)
        (self.folder / SUMMARY_FILE).write_text(text + "\n", encoding="utf-8")

    async def close(self) -> None:
        if self._samples is not None:
            self._samples.close()
            self._samples = None


class FanOutSink:
    """Publishes to several sinks in order (e.g. a recording and stdout)."""

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = list(sinks)

    async def publish_inventory(self, inventory: GpuInventory) -> None:
        for sink in self.sinks:
            if hasattr(sink, "publish_inventory"):
                await sink.publish_inventory(inventory)

    async def publish(self, samples: Sequence[GpuSample]) -> None:
        for sink in self.sinks:
            await sink.publish(samples)

    async def close(self) -> None:
        for sink in self.sinks:
            if hasattr(sink, "close"):
                await sink.close()


def read_recording(folder: Path) -> tuple[GpuInventory, list[GpuSample]]:
    """Read a recording, naming the file, line and field of the first thing that is wrong."""
    inventory_path = folder / INVENTORY_FILE
    samples_path = folder / SAMPLES_FILE
    for path in (inventory_path, samples_path):
        if not path.is_file():
            raise RecordError(f"{path}: missing (a recording folder holds {INVENTORY_FILE} and {SAMPLES_FILE})")
    try:
        inventory = inventory_from_dict(json.loads(inventory_path.read_text(encoding="utf-8")))
    except json.JSONDecodeError as error:
        raise RecordError(f"{inventory_path}: not JSON ({error})") from error
    except RecordError as error:
        raise RecordError(f"{inventory_path}: {error}") from error
    samples: list[GpuSample] = []
    with open(samples_path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{samples_path}:{number}: "
            try:
                samples.append(sample_from_dict(json.loads(line), where))
            except json.JSONDecodeError as error:
                raise RecordError(f"{where}not JSON ({error})") from error
    return inventory, samples
