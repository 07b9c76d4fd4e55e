"""Job history keyed by what jobs share: the key hierarchy (user and job name -> queue -> global), rolling
windows of log run time per key, and the constants every model shares (the prior before any job has finished,
the clamps on run times).

Run times are heavy-tailed (seconds to weeks), so history is kept as log run time. A key's long history
predicts better than its last few runs on Philly (docs/forecast.md), so each key keeps short and long windows,
and a cold key falls back to its queue, then to all jobs, then to the prior.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from kumiki.sched.forecasting import JobFeatures

# Run times below a second carry no information beyond "very short"; clamping keeps logs finite.
MIN_RUNTIME_S = 1.0
P90_LEVEL = 0.9
# Before any job has finished: half an hour, and a p90 e^2 (~7x) above it.
PRIOR_LOG_S = math.log(1800.0)
PRIOR_P90_OFFSET = 2.0
# No forecast is longer than a year: a regression fitted on few runs can extrapolate to exp(1000) (an
# OverflowError that would fail the forecast service's handler and the simulator); past this it is no forecast.
MAX_LOG_S = math.log(365 * 86400.0)

Key = tuple[str, ...]
GLOBAL_KEY: Key = ("all",)
# Forecasts kept until their job finishes; a job that never reports its end (cancelled before it
# ran, lost) must not grow memory forever, so the oldest are forgotten beyond this many.
MAX_OPEN_FORECASTS = 200_000
Remembered = TypeVar("Remembered")


def remember(open_forecasts: dict[str, Remembered], job_id: str, value: Remembered) -> None:
    """Keep what was forecast for a job until it finishes, forgetting the oldest beyond the bound."""
    open_forecasts.pop(job_id, None)
    open_forecasts[job_id] = value
    while len(open_forecasts) > MAX_OPEN_FORECASTS:
        del open_forecasts[next(iter(open_forecasts))]


def log_runtime(runtime_s: float) -> float:
    return math.log(max(runtime_s, MIN_RUNTIME_S))


def job_keys(job: JobFeatures) -> tuple[Key, ...]:
    """History keys from most specific to least: (queue, user, gpus, image, command, time limit) →
    (queue, user, gpus, name) → (queue, gpus) → queue → all.

    The first level is the job's own script: the same user running the same command in the same image and
    asking for the same time is, more than anything else, the same job again (job names are often generated
    afresh for every submission, so the name is not part of it). Levels whose own fields are all
    empty (the Philly trace has no user, name, image, command or limit) are dropped rather than kept as
    duplicates of the level below, so traces without them are keyed exactly as before.
    """
    return _keys(job.queue, job.user, job.gpus, job.name, job.image, job.command, job.time_limit_s)


@functools.lru_cache(maxsize=1 << 16)
def _keys(
    queue: str, user: str, gpus: float, name: str, image: str, command: str, time_limit_s: float | None
) -> tuple[Key, ...]:
    count = f"{gpus:g}"
    keys: list[Key] = []
    if image or command or time_limit_s:
        keys.append(("s", queue, user, count, image, command, f"{time_limit_s or 0:g}"))
    if user or name:
        keys.append(("k", queue, user, count, name))
    keys.append(("qg", queue, count))
    keys.append(("q", queue))
    keys.append(GLOBAL_KEY)
    return tuple(keys)


class RollingWindow:
    """The last `capacity` values in arrival order and in sorted order: quantiles in O(1)."""

    __slots__ = ("_order", "_sorted", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._order: deque[float] = deque()
        self._sorted: list[float] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, value: float) -> None:
        if len(self._order) == self.capacity:
            oldest = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._order.append(value)
        bisect.insort(self._sorted, value)

    def quantile(self, level: float) -> float:
        """Empirical quantile with linear interpolation (numpy's default)."""
        if not self._sorted:
            raise ValueError("quantile of an empty window")
        position = level * (len(self._sorted) - 1)
        low = math.floor(position)
        high = min(low + 1, len(self._sorted) - 1)
        return self._sorted[low] + (self._sorted[high] - self._sorted[low]) * (position - low)

    def median(self) -> float:
        return self.quantile(0.5)

    def last(self, count: int) -> list[float]:
        return list(self._order)[-count:]


@dataclass(frozen=True, slots=True)
class HistoryConfig:
    long_window: int = 1000
    short_window: int = 100
    recent_window: int = 20
    min_count: int = 3  # a key needs this many completions before its own median is trusted


class KeyedHistory:
    """Rolling windows of log run time for every key level of every job seen finishing."""

    def __init__(self, config: HistoryConfig) -> None:
        self.config = config
        self._windows: dict[tuple[Key, int], RollingWindow] = {}
        self.counts: dict[Key, int] = {}

    def add(self, job: JobFeatures, log_runtime_s: float) -> None:
        sizes = (self.config.long_window, self.config.short_window, self.config.recent_window)
        for key in job_keys(job):
            self.counts[key] = self.counts.get(key, 0) + 1
            for size in sizes:
                window = self._windows.get((key, size))
                if window is None:
                    window = self._windows[(key, size)] = RollingWindow(size)
                window.add(log_runtime_s)

    def window(self, key: Key, size: int) -> RollingWindow | None:
        return self._windows.get((key, size))

    def median(self, job: JobFeatures, size: int, *, skip_levels: int = 0) -> float:
        """Median of the most specific key with enough history: key → queue → global → prior."""
        for key in job_keys(job)[skip_levels:]:
            window = self._windows.get((key, size))
            needed = 1 if key == GLOBAL_KEY else self.config.min_count
            if window is not None and len(window) >= needed:
                return window.median()
        return PRIOR_LOG_S


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0
