"""`kumiki trace JOB`: a job's decision traces from Jaeger's query API, printed as trees with timings.

What an operator asks first is "why did my job land there" or "why is it waiting": every Bind of the job is
one trace whose `schedule` span carries the outcome, the chosen nodes or the pending reason, with quota's
admission and the events it caused below it. Traces are found by the decision span's `kumiki.job.id` tag on
service kumiki-placement (`/api/traces?service=...&tags=...`), so a trace started by the binder, the CLI or the
replay is found the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kumiki.cli.main import UsageError, message_console

console = message_console()
DEFAULT_URL = "http://127.0.0.1:16686"
DECISION_SERVICE = "kumiki-placement"
DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# attributes worth a line on the tree, in this order (the rest are in --json)
SHOWN = (
    "kumiki.outcome",
    "kumiki.queue",
    "kumiki.gpus",
    "kumiki.nodes",
    "kumiki.pending.reason",
    "kumiki.quota.outcome",
    "kumiki.quota.code",
    "kumiki.quota.victims",
    "kumiki.preemption.reason",
    "kumiki.preemption.beneficiary",
    "kumiki.preemption.forced",
    "kumiki.preemption.lost_gpu_seconds",
    "messaging.destination.name",
    "messaging.consumer.group.name",
    "rpc.grpc.status_code",
    "error",
)


class JaegerError(RuntimeError):
    """Jaeger could not be asked (unreachable, or it answered an error)."""


@dataclass
class Span:
    span_id: str
    parent: str | None
    service: str
    name: str
    kind: str
    start_us: int
    duration_us: int
    tags: dict[str, Any]
    children: list[Span] = field(default_factory=list)


def parse_duration(text: str, option: str) -> float:
    match = DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"{option}: expected a duration like 30m, 24h or 7d, got {text!r}")
    return float(match.group(1)) * UNIT_S[match.group(2)]


def query_url(explicit: str | None) -> str:
    """--jaeger, else KUMIKI_JAEGER_QUERY_URL, else the local stack's Jaeger (`kumiki up --observability`)."""
    url = explicit or os.environ.get("KUMIKI_JAEGER_QUERY_URL")
    if not url:
        from kumiki.devstack.observability import observability_state
        from kumiki.devstack.stack import stack_home

        running = observability_state(stack_home() / "observability")
        url = f"http://127.0.0.1:{running['jaeger']['query_port']}" if running else DEFAULT_URL
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--jaeger: expected http(s)://host:port of Jaeger's query API, got {url!r}")
    return url.rstrip("/")


def find_traces(url: str, job_id: str, since_s: float, limit: int, now_s: float | None = None) -> list[dict[str, Any]]:
    """Every trace (whole, as Jaeger stores it) with a decision span for this job, oldest first."""
    now_us = int((time.time() if now_s is None else now_s) * 1e6)
    params = {
        "service": DECISION_SERVICE,
        "tags": json.dumps({"kumiki.job.id": job_id}),
        "start": str(now_us - int(since_s * 1e6)),
        "end": str(now_us),
        "limit": str(limit),
    }
    address = f"{url}/api/traces?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(address, timeout=10) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as error:
        raise JaegerError(f"Jaeger at {url} answered {error.code}: {error.read()[:300]!r}") from None
    except (OSError, ValueError) as error:
        raise JaegerError(f"cannot reach Jaeger's query API at {url}: {error}") from None
    traces = list(body.get("data") or [])
    return sorted(traces, key=lambda data: min((span["startTime"] for span in data["spans"]), default=0))


def tree(data: dict[str, Any]) -> list[Span]:
    """The roots of a Jaeger trace (a span whose parent is missing, e.g. not exported, is a root too)."""
    services = {key: value["serviceName"] for key, value in data.get("processes", {}).items()}
    spans: dict[str, Span] = {}
    for raw in data["spans"]:
        tags = {tag["key"]: tag["value"] for tag in raw.get("tags", [])}
        parents = [ref["spanID"] for ref in raw.get("references", []) if ref.get("refType") == "CHILD_OF"]
        spans[raw["spanID"]] = Span(
            raw["spanID"],
            parents[0] if parents else None,
            services.get(raw.get("processID", ""), "?"),
            raw["operationName"],
            str(tags.get("span.kind", "internal")),
            int(raw["startTime"]),
            int(raw["duration"]),
            tags,
        )
    roots: list[Span] = []
    for span in spans.values():
        parent = spans.get(span.parent or "")
        (parent.children if parent is not None else roots).append(span)
    for span in spans.values():
        span.children.sort(key=lambda child: child.start_us)
    return sorted(roots, key=lambda root: root.start_us)


def _value(value: Any) -> Any:
    """A tag's value: Jaeger stores an attribute array as its JSON text."""
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        return round(value, 2)  # lost GPU-seconds, fractions: enough to read
    return value


def _ms(us: int) -> str:
    return f"{us / 1000:.1f} ms" if us < 10_000_000 else f"{us / 1e6:.1f} s"


def _attributes(span: Span) -> str:
    shown = []
    for key in SHOWN:
        if key not in span.tags or (key == "rpc.grpc.status_code" and span.tags[key] == 0):
            continue
        value = _value(span.tags[key])
        if value in ("", None) or (key == "messaging.destination.name" and str(value) in span.name):
            continue  # nothing to say, or the span's name says it already
        shown.append(f"{key.removeprefix('kumiki.').removeprefix('messaging.')}={value}")
    return "  " + " ".join(shown) if shown else ""


def summary(roots: Sequence[Span], job_id: str | None = None) -> str:
    """One line for the whole decision: the outcome and where, or why it waits; for a job preempted in this
    trace (another job's decision), that it was preempted, for whom, and where its next attempt went."""
    spans: list[Span] = []
    stack = list(roots)
    while stack:
        span = stack.pop(0)
        spans.append(span)
        stack.extend(span.children)
    preempted = [s for s in spans if s.name == "preempt" and s.tags.get("kumiki.job.id") == job_id]
    if job_id is not None and preempted:
        tags = preempted[0].tags
        line = (
            f"preempted for {tags.get('kumiki.preemption.beneficiary', '?')} ({tags.get('kumiki.preemption.reason')})"
        )
        evicted = [s for s in spans if s.name == "evict command" and s.tags.get("kumiki.job.id") == job_id]
        if evicted:
            line += ", evicted" + (" at the deadline" if evicted[0].tags.get("kumiki.preemption.forced") else "")
        rebound = [
            s
            for s in spans
            if s.name == "schedule" and s.tags.get("kumiki.requeued") and s.tags.get("kumiki.job.id") == job_id
        ]
        if rebound:
            line += f", attempt {_value(rebound[0].tags.get('kumiki.job.generation'))} bound on"
            line += f" {_value(rebound[0].tags.get('kumiki.nodes', '?'))}"
        return line
    stack = list(roots)
    while stack:
        span = stack.pop(0)
        if span.name == "schedule" and "kumiki.outcome" in span.tags:
            tags = span.tags
            if tags["kumiki.outcome"] in ("bound", "replayed"):
                return f"{tags['kumiki.outcome']} on {_value(tags.get('kumiki.nodes', '?'))}"
            if tags["kumiki.outcome"] == "pending":
                return f"pending: {tags.get('kumiki.pending.reason', '?')}"
            return str(tags["kumiki.outcome"])
        stack.extend(span.children)
    return "no decision span (sampled out in placement?)"


def render(data: dict[str, Any], job_id: str | None = None) -> list[str]:
    """A trace as lines: a header (id, start, total time, outcome), then one line per span, indented as a tree,
    with its service, kind, duration and its start after the trace began."""
    roots = tree(data)
    if not roots:
        return []
    start = min(root.start_us for root in roots)
    end = max(int(span["startTime"]) + int(span["duration"]) for span in data["spans"])  # consumers outlast the root
    began = datetime.fromtimestamp(start / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    lines = [f"trace {data['traceID']}  {began} UTC  {_ms(end - start)}  {summary(roots, job_id)}"]

    def walk(span: Span, prefix: str, last: bool) -> None:
        kind = f" [{span.kind}]" if span.kind not in ("internal", "") else ""
        lines.append(
            f"{prefix}{'└─ ' if last else '├─ '}{span.service}  {span.name}{kind}  {_ms(span.duration_us)}"
            f"  @+{_ms(span.start_us - start)}{_attributes(span)}"
        )
        for index, child in enumerate(span.children):
            walk(child, prefix + ("   " if last else "│  "), index == len(span.children) - 1)

    for index, root in enumerate(roots):
        walk(root, "", index == len(roots) - 1)
    return lines


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    trace = subparsers.add_parser(
        "trace", help="a job's decision traces from Jaeger, as trees with timings (why it landed there, or waits)"
    )
    trace.add_argument("job_id", metavar="JOB")
    trace.add_argument(
        "--jaeger",
        default=None,
        help=f"Jaeger query API (default $KUMIKI_JAEGER_QUERY_URL, the local stack's, or {DEFAULT_URL})",
    )
    trace.add_argument("--since", default="24h", help="how far back to look: 30m, 24h, 7d (default 24h)")
    trace.add_argument("--limit", type=int, default=20, help="at most this many traces, 1..1000 (default 20)")
    trace.add_argument("--json", action="store_true", help="Jaeger's trace JSON instead of the tree")
    trace.set_defaults(handler=_trace)


def _trace(args: argparse.Namespace) -> int:
    job_id = args.job_id.strip()
    if not job_id:
        raise UsageError("JOB: must not be empty")
    if not 1 <= args.limit <= 1000:
        raise UsageError(f"--limit: expected 1..1000, got {args.limit}")
    since_s = parse_duration(args.since, "--since")
    url = query_url(args.jaeger)
    try:
        traces = find_traces(url, job_id, since_s, args.limit)
    except JaegerError as error:
        console.print(f"kumiki trace: {error}", style="red", markup=False)
        return 1
    if not traces:
        console.print(f"kumiki trace: no decision traces for job {job_id!r} in the last {args.since} at {url}")
        return 3
    if args.json:
        print(json.dumps(traces, indent=2))
        return 0
    for index, data in enumerate(traces):
        if index:
            print()
        print("\n".join(render(data, job_id)))
    return 0
