from datetime import UTC, datetime

import pytest

from kumiki.common.bus.cloudevents import CloudEventAttributes, CloudEventError, parse_headers


def test_headers_round_trip() -> None:
    moment = datetime(2026, 11, 29, 12, 30, 1, 250000, tzinfo=UTC)
    attributes = CloudEventAttributes.new("dev.kumiki.v1.JobLifecycle", "//kumiki/test", "id-1", moment)
    headers = attributes.headers()
    assert dict(headers)["ce_time"] == b"2026-11-29T12:30:01.250000Z"
    assert dict(headers)["content-type"] == b"application/protobuf"
    assert parse_headers(headers) == attributes


@pytest.mark.parametrize("missing", ["ce_specversion", "ce_type", "ce_source", "ce_id", "ce_time"])
def test_missing_header_is_named(missing: str) -> None:
    headers = [(k, v) for k, v in CloudEventAttributes.new("t", "s").headers() if k != missing]
    with pytest.raises(CloudEventError, match=f"header {missing}: missing"):
        parse_headers(headers)


def test_wrong_spec_version_and_time_are_named() -> None:
    headers = dict(CloudEventAttributes.new("t", "s").headers())
    with pytest.raises(CloudEventError, match="ce_specversion"):
        parse_headers(list({**headers, "ce_specversion": b"0.3"}.items()))
    with pytest.raises(CloudEventError, match="ce_time"):
        parse_headers(list({**headers, "ce_time": b"yesterday"}.items()))


def test_new_ids_are_unique() -> None:
    assert len({CloudEventAttributes.new("t", "s").id for _ in range(1000)}) == 1000
