"""Cost of forecasting: replaying a trace through predict+observe, predict latency, and refit time.

    .venv/bin/python benchmarks/forecast_speed.py [--trace philly-slice]

Ratios are against the "global median so far" baseline replayed in the same process, and the refit
on 100,000 rows against a refit on the default 4,000-row window.
"""

from __future__ import annotations

import math
import random
import sys
import time

from _support import trace_jobs

from kumiki.forecast.demand import forecast_series
from kumiki.forecast.evaluate import default_factories, job_features, replay
from kumiki.forecast.models import QuantileRegression, QuantRegConfig, build_default_forecaster


def replay_cpu(jobs: list, name: str) -> float:  # type: ignore[type-arg]
    started = time.process_time()
    replay(jobs, {name: default_factories()[name]})
    return time.process_time() - started


def refit_seconds(rows: int, seed: int = 1) -> float:
    rng = random.Random(seed)
    regression = QuantileRegression(QuantRegConfig(window=rows, min_rows=rows + 1, refit_every=10**9))
    for _ in range(rows):
        features = (
            1.0,
            *(rng.gauss(0, 1) for _ in range(5)),
            math.log2(rng.choice((1, 2, 4, 8))),
            rng.random(),
        )
        regression.add(features, features[1] + rng.gauss(0, 1))
    started = time.perf_counter()
    regression.refit()
    elapsed = time.perf_counter() - started
    assert regression.version == 1, "refit failed"
    return elapsed


def main() -> int:
    jobs = trace_jobs(__doc__.splitlines()[0])
    print(f"replay of {len(jobs)} jobs through predict + observe (CPU seconds, best of 3):")
    baseline = min(replay_cpu(jobs, "global-median") for _ in range(3))
    for name in default_factories():
        cpu = min(replay_cpu(jobs, name) for _ in range(3))
        print(f"  {name:15s} {cpu:6.3f} s   x{cpu / baseline:5.2f} global-median   {1e6 * cpu / len(jobs):6.1f} us/job")

    forecaster = build_default_forecaster()
    features = [job_features(job) for job in jobs]
    latencies = []
    for job, feature in zip(jobs, features, strict=True):
        started = time.perf_counter()
        forecaster.predict(feature)
        latencies.append(time.perf_counter() - started)
        assert job.duration_s is not None
        forecaster.observe(feature, job.duration_s, 0.0)  # order does not matter for timing
    latencies.sort()
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[int(0.99 * len(latencies))]
    print(f"kumiki predict in-process: p50 {1e6 * p50:.1f} us, p99 {1e6 * p99:.1f} us")

    small = min(refit_seconds(4_000) for _ in range(3))
    large = min(refit_seconds(100_000) for _ in range(3))
    print(f"QuantReg p50+p90 refit: 4,000 rows {small:.3f} s; 100,000 rows {large:.3f} s (x{large / small:.1f})")

    series = [float(10 + 5 * math.sin(2 * math.pi * hour / 24) + (hour % 7)) for hour in range(24 * 7)]
    started = time.perf_counter()
    forecast_series(series, 24)
    print(f"Holt-Winters fit+forecast on a week of hourly demand: {time.perf_counter() - started:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
