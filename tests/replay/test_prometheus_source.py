"""The arithmetic and the input checks of `kumiki report --prometheus` (the live test against a real Prometheus
scraping the services is tests/observability/test_report_prometheus.py)."""

from __future__ import annotations

import math

import pytest

from kumiki.replay.prometheus_source import (
    SourceUsageError,
    Window,
    check_range,
    counter_increase,
    figures,
    histogram_quantile,
    parse_time,
    parse_url,
    ratio_while,
    step_for,
)

NOW = 1_796_148_000.0


def test_a_counter_counts_its_steps_a_reset_counts_from_zero_and_a_series_born_in_the_range_from_zero() -> None:
    existed = [(100.0, 5.0), (110.0, 7.0), (120.0, 7.0), (130.0, 9.0)]
    assert counter_increase(existed, start_s=100.0, step_s=10.0) == 4.0
    restarted = [(100.0, 5.0), (110.0, 7.0), (120.0, 1.0), (130.0, 3.0)]  # 7 -> 1: a restart, then +1 +2
    assert counter_increase(restarted, start_s=100.0, step_s=10.0) == 2.0 + 1.0 + 2.0
    born = [(120.0, 1.0), (130.0, 2.0)]  # prometheus_client creates a labelled series at its first increment
    assert counter_increase(born, start_s=100.0, step_s=10.0) == 2.0
    assert counter_increase([], start_s=100.0, step_s=10.0) == 0.0


def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    buckets = {1.0: 10.0, 2.0: 30.0, 5.0: 40.0, math.inf: 40.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(1.5)  # rank 20: halfway through (1, 2]
    assert histogram_quantile(0.95, buckets) == pytest.approx(2.0 + 3.0 * (38 - 30) / 10)
    assert histogram_quantile(0.95, {1.0: 0.0, math.inf: 4.0}) == 1.0  # in +Inf: the largest finite bound
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None


def test_while_jobs_wait_is_the_mean_over_the_steps_with_a_pending_job() -> None:
    allocated = [(1.0, 8.0), (2.0, 16.0), (3.0, 4.0)]
    capacity = [(1.0, 16.0), (2.0, 16.0), (3.0, 16.0)]
    pending = [(1.0, 0.0), (2.0, 3.0), (3.0, 1.0)]
    assert ratio_while(allocated, capacity, pending) == pytest.approx((1.0 + 0.25) / 2)
    assert ratio_while(allocated, capacity, [(1.0, 0.0)]) is None


def test_figures_from_series_and_dashes_for_what_prometheus_does_not_have() -> None:
    window = Window(100.0, 3700.0, 10.0)
    series = {
        "kumiki_placement_job_completion_seconds_count": [
            ({"queue": "a", "final_state": "completed"}, [(100.0, 2.0), (3700.0, 6.0)]),
            ({"queue": "a", "final_state": "failed"}, [(200.0, 1.0)]),
        ],
        "kumiki_placement_job_completion_seconds_sum": [
            ({"queue": "a", "final_state": "completed"}, [(100.0, 50.0), (3700.0, 450.0)])
        ],
        'kumiki_placement_binds_total{outcome="bound"}': [({"outcome": "bound"}, [(100.0, 0.0), (3700.0, 36.0)])],
        "sum(kumiki_placement_allocated_gpus)": [({}, [(100.0, 8.0), (3700.0, 8.0)])],
        "sum(kumiki_placement_pending_jobs)": [({}, [(100.0, 0.0), (3700.0, 2.0)])],
    }
    found = figures(window, lambda expression: series.get(expression, []))
    assert found["completed"] == 4.0 and found["failed"] == 1.0
    assert found["avg_jct_s"] == 100.0
    assert found["binds"] == 36.0 and found["binds_per_s"] == pytest.approx(0.01)
    assert found["avg_allocated_gpus"] == 8.0 and found["max_pending"] == 2.0
    assert found["jobs_per_gpu_h"] == pytest.approx(4.0 / 8.0)  # 8 GPUs held for the hour
    # no telemetry, binder or preemption scraped: not zero, unknown
    for key in ("allocation", "utilisation_pct", "idle_gpu_h", "lost_gpu_h", "pods_bound", "p95_jct_s"):
        assert found[key] is None, key
    assert figures(window, lambda expression: [])["seen"] == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-01T18:00:00Z", 1796148000.0),
        ("2026-12-01T19:00:00+01:00", 1796148000.0),
        ("1796148000", 1796148000.0),
        ("now", NOW),
        ("-2h", NOW - 7200),
        ("now-30m", NOW - 1800),
    ],
)
def test_times(text: str, expected: float) -> None:
    assert parse_time(text, "--start", NOW) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("yesterday", "--start: expected RFC 3339"),
        ("2026-12-01T18:00:00", "--start: '2026-12-01T18:00:00' has no time zone"),
        ("-5", "--start: expected a time after 1970"),
        ("nan", "--start: expected a time after 1970"),
    ],
)
def test_a_bad_time_names_the_flag(text: str, problem: str) -> None:
    with pytest.raises(SourceUsageError, match=problem):
        parse_time(text, "--start", NOW)


@pytest.mark.parametrize("url", ["localhost:9090", "ftp://host:9090", "http://", "http://host:9090/?q=1"])
def test_a_bad_url_names_the_flag(url: str) -> None:
    with pytest.raises(SourceUsageError, match="--prometheus: expected http"):
        parse_url(url)


def test_ranges() -> None:
    with pytest.raises(SourceUsageError, match="--end: must be after --start"):
        check_range(NOW, NOW, NOW)
    with pytest.raises(SourceUsageError, match="at most 90"):
        check_range(NOW - 100 * 86400, NOW, NOW)
    with pytest.raises(SourceUsageError, match=r"--start: .* is in the future"):
        check_range(NOW + 60, NOW + 120, NOW)
    assert step_for(0, 600) == 1.0 and step_for(0, 86400) == 87.0
