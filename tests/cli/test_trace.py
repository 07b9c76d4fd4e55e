"""`kumiki trace`'s tree, from Jaeger's trace JSON (pure; tests/observability reads real Jaeger)."""

from __future__ import annotations

from typing import Any

import pytest

from kumiki.cli.main import UsageError
from kumiki.cli.trace import parse_duration, query_url, render


def span(
    span_id: str, name: str, start: int, duration: int, parent: str | None = None, process: str = "p1", **tags: Any
) -> dict[str, Any]:
    return {
        "spanID": span_id,
        "operationName": name,
        "startTime": start,
        "duration": duration,
        "processID": process,
        "references": [{"refType": "CHILD_OF", "spanID": parent}] if parent else [],
        "tags": [{"key": key.replace("__", "."), "value": value} for key, value in tags.items()],
    }


def trace(*spans: dict[str, Any]) -> dict[str, Any]:
    processes = {"p1": {"serviceName": "kumiki-placement"}, "p2": {"serviceName": "kumiki-quota"}}
    return {"traceID": "ab" * 16, "spans": list(spans), "processes": processes}


def test_a_decision_renders_as_a_tree_with_offsets_and_its_outcome_on_top() -> None:
    lines = render(
        trace(
            span(
                "s",
                "schedule",
                1_000_100,
                900,
                "b",
                kumiki__outcome="pending",
                kumiki__pending__reason="j: quota: over limit (needs 1 GPU)",
            ),
            span("b", "kumiki.v1.Placement/Bind", 1_000_000, 1_200, span__kind="server", rpc__grpc__status_code=0),
            span("a", "kumiki.v1.Quota/Admit", 1_000_200, 300, "s", process="p2", span__kind="server"),
            span("x", "send", 1_000_600, 200, "s", span__kind="producer"),
            span("o", "process t", 1_005_000, 50, "gone", span__kind="consumer"),  # its parent was not exported
        )
    )
    assert lines[0].startswith(f"trace {'ab' * 16}  1970-01-01 00:00:01.000 UTC  5.0 ms  pending: j: quota: over")
    assert lines[1:] == [
        "├─ kumiki-placement  kumiki.v1.Placement/Bind [server]  1.2 ms  @+0.0 ms",
        "│  └─ kumiki-placement  schedule  0.9 ms  @+0.1 ms  outcome=pending pending.reason=j: quota: over limit"
        " (needs 1 GPU)",
        "│     ├─ kumiki-quota  kumiki.v1.Quota/Admit [server]  0.3 ms  @+0.2 ms",
        "│     └─ kumiki-placement  send [producer]  0.2 ms  @+0.6 ms",
        "└─ kumiki-placement  process t [consumer]  0.1 ms  @+5.0 ms",
    ]


def test_options_are_checked() -> None:
    assert parse_duration("90m", "--since") == 5400
    for bad in ("", "0h", "1w", "soon"):
        with pytest.raises(UsageError, match="--since: expected a duration"):
            parse_duration(bad, "--since")
    assert query_url("http://127.0.0.1:16686/") == "http://127.0.0.1:16686"
    with pytest.raises(UsageError, match="--jaeger: expected http"):
        query_url("127.0.0.1:16686")
