import pytest

from kumiki.common.bus.cloudevents import CloudEventAttributes
from kumiki.common.bus.codec import RejectedRecord, decode
from kumiki.common.bus.topics import ALL_TOPICS, GPU_SAMPLES, JOB_LIFECYCLE
from kumiki.common.contracts.v1 import common_pb2, events_pb2


def _headers(spec=JOB_LIFECYCLE):  # type: ignore[no-untyped-def]
    return CloudEventAttributes.new(spec.ce_type, "//test").headers()


def _job(**fields) -> events_pb2.JobLifecycle:  # type: ignore[no-untyped-def]
    defaults = {"job": common_pb2.JobRef(job_id="j1", generation=1), "state": events_pb2.JOB_STATE_SUBMITTED}
    return events_pb2.JobLifecycle(**{**defaults, **fields})


def test_valid_record_decodes() -> None:
    event = decode(JOB_LIFECYCLE, b"j1", _job(queue="q").SerializeToString(), _headers())
    assert event.key == "j1"
    assert event.payload.queue == "q"


def test_undecodable_value_is_rejected_with_type_name() -> None:
    with pytest.raises(RejectedRecord, match=r"not a valid kumiki\.v1\.JobLifecycle"):
        decode(JOB_LIFECYCLE, b"j1", b"\xff\xff\xff\xff", _headers())


def test_wrong_type_header_is_rejected() -> None:
    with pytest.raises(RejectedRecord, match=r"ce_type: expected dev\.kumiki\.v1\.JobLifecycle"):
        decode(JOB_LIFECYCLE, b"j1", _job().SerializeToString(), _headers(GPU_SAMPLES))


def test_validation_names_fields() -> None:
    with pytest.raises(RejectedRecord, match=r"job\.generation: must be >= 1"):
        decode(JOB_LIFECYCLE, b"j1", _job(job=common_pb2.JobRef(job_id="j1")).SerializeToString(), _headers())
    sample = events_pb2.GpuSample(
        node="n1", gpu_uuid="GPU-1", gpu_utilization_pct=140, memory_used_mib=90, memory_total_mib=80
    )
    with pytest.raises(RejectedRecord) as error:
        decode(GPU_SAMPLES, b"k", sample.SerializeToString(), _headers(GPU_SAMPLES))
    assert "gpu_utilization_pct: must be within 0..100" in str(error.value)
    assert "memory_used_mib: 90 exceeds memory_total_mib 80" in str(error.value)


def test_tombstone_is_rejected() -> None:
    with pytest.raises(RejectedRecord, match="empty record"):
        decode(JOB_LIFECYCLE, b"j1", None, _headers())


def test_registry_names_are_unique_and_prefixed() -> None:
    names = [spec.full_name("kumiki.") for spec in ALL_TOPICS]
    assert len(set(names)) == len(names)
    assert all(name.startswith("kumiki.") for name in names)
    compacted = {spec.name for spec in ALL_TOPICS if spec.cleanup_policy == "compact"}
    assert compacted == {"cluster.state", "node.inventory", "job.forecast", "quota.state"}
