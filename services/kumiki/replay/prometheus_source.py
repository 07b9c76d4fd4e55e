"""`kumiki report --prometheus URL --start T --end T`: the report's figures from a Prometheus server that
scraped the services, so a platform team gets the before/after report from its own cluster's metrics instead
of a replay's results.json.

Counters are read as range queries of their raw series and their increase is computed here, series by series
(a reset, a service restart, counts from 0 again). PromQL's `increase()` extrapolates to the window's edges
and misses a labelled series' first increment, because prometheus_client creates the series at 1. A series
that appears after the range starts counts from 0 instead. Gauges are aggregated by Prometheus, then averaged
over the range's steps. "While jobs wait" means the steps where placement reported a pending job.
A figure whose series Prometheus does not have (no telemetry service, no binder) is None, shown as "-".
"""

from __future__ import annotations

import itertools
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Series = list[tuple[float, float]]  # (unix seconds, value), in time order
Labelled = list[tuple[dict[str, str], Series]]

MAX_RANGE_S = 90 * 86400.0
MAX_POINTS = 1000  # per series: steps are at least range / 1000 (Prometheus refuses more than 11,000)
_RELATIVE = re.compile(r"^(?:now)?\s*-\s*(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or answered an error; the message names the flag to look at."""


class SourceUsageError(ValueError):
    """A bad --prometheus, --start or --end (the message names the flag)."""


# ---- inputs -------------------------------------------------------------------------------------------------


def parse_url(text: str, flag: str = "--prometheus") -> str:
    parsed = urllib.parse.urlparse(text.strip())
    if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment:
        raise SourceUsageError(f"{flag}: expected http(s)://host:port of a Prometheus server, got {text!r}")
    return text.strip().rstrip("/")


def parse_time(text: str, flag: str, now_s: float) -> float:
    """RFC 3339 (`2026-12-01T18:00:00Z`), Unix seconds, `now`, or a time before now (`-2h`, `now-30m`)."""
    raw = text.strip()
    if raw == "now":
        return now_s
    relative = _RELATIVE.match(raw)
    if relative:
        return now_s - float(relative.group(1)) * _UNIT_S[relative.group(2)]
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or value <= 0:
            raise SourceUsageError(f"{flag}: expected a time after 1970, got {text!r}")
        return value
    try:
        stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise SourceUsageError(
            f"{flag}: expected RFC 3339 (2026-12-01T18:00:00Z), Unix seconds, now or -2h, got {text!r}"
        ) from None
    if stamp.tzinfo is None:
        raise SourceUsageError(f"{flag}: {text!r} has no time zone (add Z or +00:00)")
    return stamp.timestamp()


def check_range(start_s: float, end_s: float, now_s: float) -> None:
    if end_s <= start_s:
        raise SourceUsageError(f"--end: must be after --start ({_when(end_s)} is not after {_when(start_s)})")
    if end_s - start_s > MAX_RANGE_S:
        raise SourceUsageError(f"--end: the range is {(end_s - start_s) / 86400:.0f} days; at most 90")
    if start_s > now_s:
        raise SourceUsageError(f"--start: {_when(start_s)} is in the future")


def step_for(start_s: float, end_s: float) -> float:
    return max(1.0, math.ceil((end_s - start_s) / MAX_POINTS))


# ---- the arithmetic (pure) ----------------------------------------------------------------------------------


def counter_increase(series: Series, start_s: float, step_s: float) -> float:
    """What a counter series counted over the range: positive steps, a drop is a reset (counts from 0 again),
    and a series first seen after the range's start counts from 0 (it was created inside the range)."""
    if not series:
        return 0.0
    total = series[0][1] if series[0][0] > start_s + step_s / 2 else 0.0
    for (_, before), (_, after) in itertools.pairwise(series):
        total += after - before if after >= before else after
    return total


def summed_increase(labelled: Labelled, start_s: float, step_s: float, match: Mapping[str, str] = {}) -> float:
    return sum(
        counter_increase(series, start_s, step_s)
        for labels, series in labelled
        if all(labels.get(key) == value for key, value in match.items())
    )


def histogram_quantile(quantile: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' interpolation over cumulative bucket counts (`le` -> count); None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = quantile * buckets[bounds[-1]]
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # above the largest finite bucket: its bound, as Prometheus does
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def mean(series: Series) -> float | None:
    return sum(value for _, value in series) / len(series) if series else None


def ratio_while(numerator: Series, denominator: Series, condition: Series) -> float | None:
    """Mean of numerator / denominator over the steps where `condition` > 0 (all three at that step)."""
    tops, bottoms = dict(numerator), dict(denominator)
    shares = [tops[at] / bottoms[at] for at, value in condition if value > 0 and at in tops and bottoms.get(at, 0) > 0]
    return sum(shares) / len(shares) if shares else None


@dataclass(frozen=True, slots=True)
class Window:
    start_s: float
    end_s: float
    step_s: float

    @property
    def hours(self) -> float:
        return (self.end_s - self.start_s) / 3600.0


def figures(window: Window, fetch: Callable[[str], Labelled]) -> dict[str, float | None]:
    """Every figure the metrics give, from `fetch(promql)` (a range query's series); None: not in Prometheus."""
    start, step = window.start_s, window.step_s

    def one(expression: str) -> Series:
        found = fetch(expression)
        return found[0][1] if found else []

    completions = fetch("kumiki_placement_job_completion_seconds_count")
    completed = summed_increase(completions, start, step, {"final_state": "completed"})
    failed = summed_increase(completions, start, step, {"final_state": "failed"})
    jct_sum = summed_increase(
        fetch("kumiki_placement_job_completion_seconds_sum"), start, step, {"final_state": "completed"}
    )
    buckets: dict[float, float] = {}
    for labels, series in fetch('kumiki_placement_job_completion_seconds_bucket{final_state="completed"}'):
        bound = float(labels.get("le", "+Inf"))
        buckets[bound] = buckets.get(bound, 0.0) + counter_increase(series, start, step)
    waits = summed_increase(fetch("kumiki_placement_queue_wait_seconds_count"), start, step)
    wait_sum = summed_increase(fetch("kumiki_placement_queue_wait_seconds_sum"), start, step)
    bind_series = fetch('kumiki_placement_binds_total{outcome="bound"}')
    cycle_series = fetch("kumiki_placement_cycle_binds_total")
    binds = summed_increase(bind_series, start, step) + summed_increase(cycle_series, start, step)
    pods = fetch("kumiki_binder_pods_bound_total")
    idle = fetch("kumiki_queue_idle_gpu_hours_total")
    lost = fetch("kumiki_preemption_lost_gpu_hours_total")

    pending = one("sum(kumiki_placement_pending_jobs)")
    allocated = one("sum(kumiki_placement_allocated_gpus)")
    capacity = one("sum(kumiki_node_allocated_gpus) + sum(kumiki_node_free_gpus)")
    used = one("sum(kumiki_node_used_gpus)")
    utilisation = one("avg(kumiki_gpu_utilization_percent)")
    allocated_mean = mean(allocated)
    gpu_hours = allocated_mean * window.hours if allocated_mean is not None else None
    seen = completions or bind_series or cycle_series or pending or allocated or pods or idle
    return {
        "seen": 1.0 if seen else 0.0,
        "completed": completed if completions else None,
        "failed": failed if completions else None,
        "avg_jct_s": jct_sum / completed if completed else None,
        "p95_jct_s": histogram_quantile(0.95, buckets),
        "avg_queue_s": wait_sum / waits if waits else None,
        "binds": binds if bind_series or cycle_series else None,
        "binds_per_s": binds / (window.end_s - window.start_s) if bind_series or cycle_series else None,
        "pods_bound": summed_increase(pods, start, step) if pods else None,
        "avg_pending": mean(pending),
        "max_pending": max((value for _, value in pending), default=None) if pending else None,
        "avg_allocated_gpus": allocated_mean,
        "allocation": ratio_while(allocated, capacity, [(at, 1.0) for at, _ in capacity]) if capacity else None,
        "allocation_under_backlog": ratio_while(allocated, capacity, pending) if capacity else None,
        "utilisation_pct": mean(utilisation),
        "utilisation_under_backlog": ratio_while(used, capacity, pending) if capacity and used else None,
        "idle_gpu_h": summed_increase(idle, start, step) if idle else None,
        "lost_gpu_h": summed_increase(lost, start, step) if lost else None,
        "jobs_per_gpu_h": completed / gpu_hours if completions and gpu_hours else None,
    }


ROWS: tuple[tuple[str, str, str], ...] = (
    ("jobs completed", "completed", "{:,.0f}"),
    ("jobs failed", "failed", "{:,.0f}"),
    ("average JCT (s)", "avg_jct_s", "{:,.1f}"),
    ("p95 JCT (s)", "p95_jct_s", "{:,.1f}"),
    ("average queueing (s)", "avg_queue_s", "{:,.1f}"),
    ("jobs bound (on arrival and by the cycle)", "binds", "{:,.0f}"),
    ("binds/s", "binds_per_s", "{:,.3f}"),
    ("pods bound by the binder", "pods_bound", "{:,.0f}"),
    ("pending jobs (mean)", "avg_pending", "{:,.1f}"),
    ("pending jobs (max)", "max_pending", "{:,.0f}"),
    ("GPUs allocated (mean)", "avg_allocated_gpus", "{:,.1f}"),
    ("GPUs allocated (share of capacity)", "allocation", "{:.1%}"),
    ("GPUs allocated while jobs wait", "allocation_under_backlog", "{:.1%}"),
    ("GPU utilisation (mean SM %)", "utilisation_pct", "{:.1f}"),
    ("GPUs computing while jobs wait", "utilisation_under_backlog", "{:.1%}"),
    ("idle GPU-hours (allocated, computing nothing)", "idle_gpu_h", "{:,.2f}"),
    ("lost GPU-hours (preemption)", "lost_gpu_h", "{:,.2f}"),
    ("jobs completed per GPU-hour", "jobs_per_gpu_h", "{:.3f}"),
)
HIGHER_IS_BETTER = {"completed", "binds", "binds_per_s", "pods_bound", "allocation", "allocation_under_backlog"} | {
    "utilisation_pct",
    "utilisation_under_backlog",
    "jobs_per_gpu_h",
}
NOT_COMPARED = {"failed", "avg_pending", "max_pending", "avg_allocated_gpus"}


def _when(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(window: Window) -> str:
    seconds = window.end_s - window.start_s
    return (
        f"{window.hours:,.1f} h"
        if seconds >= 3600
        else f"{seconds / 60:.1f} min"
        if seconds >= 60
        else f"{seconds:.1f} s"
    )


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _ratio(before: float | None, after: float | None, key: str) -> str:
    if before is None or after is None or before == 0 or after == 0 or key in NOT_COMPARED:
        return "-"
    if key in HIGHER_IS_BETTER:
        return f"{after / before:.2f}x"
    return f"{before / after:.2f}x better" if after < before else f"{after / before:.2f}x worse"


def markdown(url: str, window: Window, result: Mapping[str, float | None], baseline: Any = None) -> str:
    """The figures as a Markdown table; with `baseline` ((Window, figures) of the "before" range), both
    columns and the ratio, as the replay's report does."""
    lines = [
        f"# Kumiki report from Prometheus at {url}",
        "",
        f"Range: {_when(window.start_s)} to {_when(window.end_s)} ({_span(window)}, step {window.step_s:g} s)"
        + (f"; baseline: {_when(baseline[0].start_s)} to {_when(baseline[0].end_s)}" if baseline else ""),
        "",
        "| | " + ("baseline | this range | this range vs baseline |" if baseline else "this range |"),
        "|---|" + ("---|---|---|" if baseline else "---|"),
    ]
    for label, key, fmt in ROWS:
        if baseline:
            before = baseline[1].get(key)
            lines.append(
                f"| {label} | {_cell(before, fmt)} | {_cell(result.get(key), fmt)} |"
                f" {_ratio(before, result.get(key), key)} |"
            )
        else:
            lines.append(f"| {label} | {_cell(result.get(key), fmt)} |")
    lines += [
        "",
        "Counters are counted series by series over the range (a restart counts from 0 again), gauges averaged"
        " over its steps. '-': not in Prometheus (no telemetry service, binder or preemption scraped) or nothing"
        " to divide by.",
        "",
    ]
    return "\n".join(lines)


# ---- the server ---------------------------------------------------------------------------------------------


class PrometheusSource:
    """Range queries against Prometheus' HTTP API (`/api/v1/query_range`)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = parse_url(url)
        self.timeout_s = timeout_s

    def _get(self, path: str, params: Mapping[str, str]) -> Any:
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=self.timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read()[:300].decode("utf-8", "replace")
            raise PrometheusError(f"--prometheus: {self.url} answered {error.code}: {detail}") from None
        except (OSError, ValueError) as error:
            raise PrometheusError(f"--prometheus: cannot reach a Prometheus server at {self.url}: {error}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusError(f"--prometheus: {self.url} is not a Prometheus query API (answered {body!r:.200})")
        return body["data"]

    def check(self) -> None:
        """Fails naming --prometheus unless the server answers a query (before any range is asked)."""
        self._get("/api/v1/query", {"query": "1"})

    def range(self, expression: str, window: Window) -> Labelled:
        data = self._get(
            "/api/v1/query_range",
            {
                "query": expression,
                "start": f"{window.start_s:.3f}",
                "end": f"{window.end_s:.3f}",
                "step": f"{window.step_s:g}",
            },
        )
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"--prometheus: expected a matrix for {expression!r}, got {data.get('resultType')}")
        out: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], Series]] = {}
        for item in data.get("result", []):
            labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
            points = [(float(at), float(value)) for at, value in item.get("values", [])]
            out[tuple(sorted(labels.items()))] = (labels, points)
        # the steps are start + n x step: a sample after the last one (up to a step before --end) is read at --end
        at_end = self._get("/api/v1/query", {"query": expression, "time": f"{window.end_s:.3f}"})
        for item in at_end.get("result", []) if at_end.get("resultType") == "vector" else []:
            labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
            _, points = out.setdefault(tuple(sorted(labels.items())), (labels, []))
            at, value = float(item["value"][0]), float(item["value"][1])
            if not points or points[-1][0] < at:
                points.append((at, value))
        return list(out.values())

    def any_series(self, window: Window) -> bool:
        """Whether Prometheus has any Kumiki series in the range (one query, before the figures' many)."""
        return bool(self.range('count({__name__=~"kumiki_.+"})', window))

    def figures(self, window: Window) -> dict[str, float | None]:
        """The figures' range queries run side by side (each is two HTTP requests to Prometheus)."""
        with ThreadPoolExecutor(max_workers=8) as pool:
            cache: dict[str, Future[Labelled]] = {}

            def submit(expression: str) -> Future[Labelled]:
                if expression not in cache:
                    cache[expression] = pool.submit(self.range, expression, window)
                return cache[expression]

            figures(window, lambda expression: (submit(expression), [])[1])  # a first pass only sends the queries
            return figures(window, lambda expression: submit(expression).result())


def report(
    url: str,
    start: str,
    end: str,
    baseline: Sequence[str] = (),
    now_s: float | None = None,
) -> tuple[str, dict[str, Any]]:
    """The Markdown report and its figures as a dict (for --json); SourceUsageError / PrometheusError name the
    flag. `baseline`: the "before" range's start and end (`--baseline-start`, `--baseline-end`)."""
    now = time.time() if now_s is None else now_s
    source = PrometheusSource(url)
    start_s, end_s = parse_time(start, "--start", now), parse_time(end, "--end", now)
    check_range(start_s, end_s, now)
    windows = [("range", Window(start_s, end_s, step_for(start_s, end_s)))]
    if baseline:
        before_start = parse_time(baseline[0], "--baseline-start", now)
        before_end = parse_time(baseline[1], "--baseline-end", now)
        try:
            check_range(before_start, before_end, now)
        except SourceUsageError as error:
            raise SourceUsageError(str(error).replace("--", "--baseline-", 1)) from None
        windows.append(("baseline", Window(before_start, before_end, step_for(before_start, before_end))))
    source.check()
    results: dict[str, dict[str, float | None]] = {}
    for name, window in windows:
        found: dict[str, float | None] = source.figures(window) if source.any_series(window) else {"seen": 0.0}
        if not found.pop("seen"):
            flag = "--start/--end" if name == "range" else "--baseline-start/--baseline-end"
            raise SourceUsageError(
                f"{flag}: Prometheus at {source.url} has no Kumiki series from {_when(window.start_s)} to"
                f" {_when(window.end_s)} (is that the run's time, and does this Prometheus scrape placement?)"
            )
        results[name] = found
    chosen = windows[0][1]
    before = (windows[1][1], results["baseline"]) if baseline else None
    text = markdown(source.url, chosen, results["range"], before)
    payload: dict[str, Any] = {
        "prometheus": source.url,
        "range": {"start_s": chosen.start_s, "end_s": chosen.end_s, "step_s": chosen.step_s, **results["range"]},
    }
    if before is not None:
        payload["baseline"] = {"start_s": before[0].start_s, "end_s": before[0].end_s, **before[1]}
    return text, payload
