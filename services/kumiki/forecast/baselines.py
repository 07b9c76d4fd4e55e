"""The baselines Kumiki's models are measured against (pure, deterministic).

- "global median so far": the median run time of every job finished so far; its p90 is their 90th
  percentile. What a scheduler with no per-job knowledge can do.
- "last two" (Tsafrir, Etsion, Feitelson, IEEE TPDS 2007): the average run time of the user's last two
  finished jobs with the same GPU count. Philly has no user, so the key is the VC (queue) there; a
  key with no history falls back to the global median so far. Its p90 is the larger of the two runs
  (the method gives no quantile; that is the natural upper value it has).
"""

from __future__ import annotations

import bisect
import math
from collections import deque

from kumiki.forecast.models.history import PRIOR_LOG_S, PRIOR_P90_OFFSET, log_runtime
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast


class GlobalMedianSoFar:
    name = "global-median"

    def __init__(self) -> None:
        self._sorted: list[float] = []

    def _quantile(self, level: float) -> float:
        position = level * (len(self._sorted) - 1)
        low = math.floor(position)
        high = min(low + 1, len(self._sorted) - 1)
        return self._sorted[low] + (self._sorted[high] - self._sorted[low]) * (position - low)

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        if not self._sorted:
            prior = math.exp(PRIOR_LOG_S)
            return RuntimeForecast(prior, prior * math.exp(PRIOR_P90_OFFSET), self.name, 0)
        return RuntimeForecast(
            math.exp(self._quantile(0.5)), math.exp(self._quantile(0.9)), self.name, len(self._sorted)
        )

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        bisect.insort(self._sorted, log_runtime(runtime_s))


def last_two_key(job: JobFeatures) -> tuple[str, str]:
    """Tsafrir's key is (user, size); without a user (Philly) the VC stands in for it."""
    return (job.user or f"queue:{job.queue}", f"{job.gpus:g}")


class LastTwoSameKey:
    name = "last-two"

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], deque[float]] = {}
        self._fallback = GlobalMedianSoFar()
        self._seen = 0

    def predict(self, job: JobFeatures) -> RuntimeForecast:
        last = self._last.get(last_two_key(job))
        if not last:
            fallback = self._fallback.predict(job)
            return RuntimeForecast(fallback.p50_s, fallback.p90_s, f"{self.name}/global-median", self._seen)
        return RuntimeForecast(sum(last) / len(last), max(last), self.name, self._seen)

    def observe(self, job: JobFeatures, runtime_s: float, finished_s: float) -> None:
        key = last_two_key(job)
        last = self._last.get(key)
        if last is None:
            last = self._last[key] = deque(maxlen=2)
        last.append(max(runtime_s, 0.0))
        self._fallback.observe(job, runtime_s, finished_s)
        self._seen += 1
