"""Stage 1's fast GpuSample path never accepts what `decode` would reject, and reads what `decode` reads."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.bus.codec import RejectedRecord, decode
from kumiki.common.bus.topics import GPU_SAMPLES
from kumiki.common.contracts.v1 import events_pb2
from kumiki.telemetry.adapters.convert import reading_from_sample, timestamp
from kumiki.telemetry.adapters.samples import FastSamples
from kumiki.telemetry.core import Reading

Headers = list[tuple[str, bytes]]
Record = tuple[bytes | None, bytes | None, Headers]


def sample(**fields: Any) -> events_pb2.GpuSample:
    values: dict[str, Any] = {
        "node": "node-a",
        "gpu_uuid": "GPU-1",
        "gpu_index": 1,
        "sampled_at": timestamp(1_700_000_000.25),
        "gpu_utilization_pct": 42.5,
        "memory_utilization_pct": 10.0,
        "memory_used_mib": 1024,
        "memory_total_mib": 81920,
        "power_w": 250.0,
        "ecc_uncorrected": 0,
        "gpu_model": "NVIDIA A100-SXM4-80GB",
    }
    values.update(fields)
    return events_pb2.GpuSample(**{name: value for name, value in values.items() if value is not None})


def headers(**changes: bytes) -> Headers:
    """What the bus producer writes, in its order; a change replaces one attribute's value."""
    attributes = CloudEventAttributes.new(GPU_SAMPLES.ce_type, "//kumiki/agent/node-a", "id-1", datetime.now(UTC))
    return [(name, changes.get(name, value)) for name, value in attributes.headers()]


def record(
    message: events_pb2.GpuSample | None = None, *, key: bytes | None = b"node-a/GPU-1", **changes: bytes
) -> Record:
    return key, (message or sample()).SerializeToString(), headers(**changes)


def decoded(key: bytes | None, value: bytes | None, head: Headers) -> Reading | None:
    """decode's verdict as a reading (None: rejected)."""
    try:
        payload = decode(GPU_SAMPLES, key, value, head).payload
    except RejectedRecord:
        return None
    assert isinstance(payload, events_pb2.GpuSample)
    return reading_from_sample(payload)


def test_the_agents_records_take_the_fast_path_and_read_what_decode_reads() -> None:
    fast = FastSamples()
    traced = record()
    traced[2].append(("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
    records = [
        record(),
        record(),  # the same ce_time again: remembered
        traced,
        record(sample(mig_instance_id=3, xid_errors=[79, 13], ecc_uncorrected=2)),
        record(sample(gpu_utilization_pct=None, memory_used_mib=None, memory_total_mib=None, power_w=None)),
        record(sample(gpu_utilization_pct=0.0, memory_utilization_pct=100.0, power_w=0.0)),
        record(key=None),
    ]
    for key, value, head in records:
        reading = fast.reading(key, value, head)
        assert reading is not None
        assert reading == decoded(key, value, head)


def _drop(name: str) -> Callable[[Headers], Headers]:
    return lambda head: [(key, value) for key, value in head if key != name]


REJECTED: dict[str, Record] = {
    "utilisation above 100": record(sample(gpu_utilization_pct=150.0)),
    "utilisation below 0": record(sample(gpu_utilization_pct=-1.0)),
    "utilisation not a number": record(sample(gpu_utilization_pct=math.nan)),
    "memory utilisation above 100": record(sample(memory_utilization_pct=101.0)),
    "memory used above total": record(sample(memory_used_mib=90000, memory_total_mib=81920)),
    "negative power": record(sample(power_w=-1.0)),
    "no node": record(sample(node="")),
    "no GPU UUID": record(sample(gpu_uuid="")),
    "wrong ce_type": record(ce_type=b"dev.kumiki.v1.NodeState"),
    "wrong ce_specversion": record(ce_specversion=b"0.3"),
    "empty ce_id": record(ce_id=b""),
    "ce_source not UTF-8": record(ce_source=b"\xff\xfe"),
    "empty ce_source": record(ce_source=b""),
    "ce_time not RFC 3339": record(ce_time=b"yesterday"),
    "ce_time not UTF-8": record(ce_time=b"\xff"),
    "key not UTF-8": record(key=b"node-a/\xff"),
    "value not a GpuSample": (b"node-a/GPU-1", b"\xff\xff\xff\xff", headers()),
    "no value": (b"node-a/GPU-1", None, headers()),
    "no ce_id header": (b"k", sample().SerializeToString(), _drop("ce_id")(headers())),
    "no ce_time header": (b"k", sample().SerializeToString(), _drop("ce_time")(headers())),
    "ce_type repeated, the last one wrong": (
        b"k",
        sample().SerializeToString(),
        [*headers(), ("ce_type", b"dev.kumiki.v1.NodeState")],
    ),
    "a header without a value": (b"k", sample().SerializeToString(), [*headers()[:3], ("ce_id", None), *headers()[4:]]),  # type: ignore[list-item]
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_a_record_decode_rejects_never_takes_the_fast_path(name: str) -> None:
    key, value, head = REJECTED[name]
    fast = FastSamples()
    fast.reading(*record())  # its caches hold a valid ce_time and ce_source
    assert decoded(key, value, head) is None  # the case is a reject at all
    assert fast.reading(key, value, head) is None


UNUSUAL: dict[str, Record] = {
    "headers in another order": (b"k", sample().SerializeToString(), list(reversed(headers()))),
    "memory used without a total": record(sample(memory_used_mib=512, memory_total_mib=None)),
    "power not a number": record(sample(power_w=math.nan)),
    "no content-type": (b"k", sample().SerializeToString(), _drop("content-type")(headers())),
}


@pytest.mark.parametrize("name", sorted(UNUSUAL))
def test_an_unusual_record_decode_accepts_reads_the_same_either_way(name: str) -> None:
    key, value, head = UNUSUAL[name]
    expected = decoded(key, value, head)
    assert expected is not None
    reading = FastSamples().reading(key, value, head)
    assert reading is None or reading == expected  # None: the caller asks decode, which accepts it
