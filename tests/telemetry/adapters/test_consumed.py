"""Consumed records, without a broker."""

from __future__ import annotations

from types import SimpleNamespace

from kumiki.telemetry.adapters.consumed import Record


def faust_event(headers: object) -> SimpleNamespace:
    message = SimpleNamespace(topic="t", partition=2, offset=41, key=b"k", value=b"v", headers=headers)
    return SimpleNamespace(message=message)


def test_a_faust_record_reads_alike_whether_its_headers_came_as_pairs_or_a_mapping() -> None:
    pairs = Record.of_faust(faust_event([("ce_id", b"1"), ("empty", None)]))
    mapping = Record.of_faust(faust_event({"ce_id": b"1", "empty": None}))
    assert pairs == mapping == Record("t", 2, 41, b"k", b"v", [("ce_id", b"1"), ("empty", b"")])
    assert Record.of_faust(faust_event(None)).headers == []
