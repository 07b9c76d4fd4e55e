"""Queue policies as data: how waiting jobs are ordered, and whether a policy blocks, reserves, backfills, preempts.

Every policy orders waiting jobs by a key that does not change while the job waits (so queues can
stay sorted incrementally). Only `*-oracle` policies read `OracleJobView.remaining_s`; the others
work from `JobView`, which has no duration.
"""

from __future__ import annotations

from dataclasses import dataclass

from kumiki.sched.jobs import JobView, OracleJobView

# Tiresias' discretised attained-service levels, in GPU-seconds (Gu et al., NSDI'19 use a few queues
# with exponentially spaced thresholds).
TIRESIAS_THRESHOLDS_GPU_S = (3600.0, 36000.0, 360000.0)
# With no forecast a job's expected remaining time is taken as what it has already run (heavy tails),
# but never below this floor, so a fresh job is not treated as already finished.
NO_FORECAST_FLOOR_S = 600.0
# A job waiting longer than this gets the reservation (large gangs first), so no job starves.
STARVATION_S = 24 * 3600.0
# `las-forecast` keys: the attained-service level dominates, the forecast orders jobs inside a level.
LEVEL_SPAN_S = 1e9


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """How a policy behaves. `order`: submit | duration | remaining | las | forecast."""

    name: str
    order: str
    strict: bool = False
    reserve: bool = False
    backfill_on_reserved: bool = False
    preemptive: bool = False
    oracle: bool = False
    uses_forecast: bool = False
    starvation_s: float = 0.0
    preempt_ratio: float = 2.0
    # never preempt jobs that fill a node or more (reservations protect them instead), so they need
    # no periodic checkpoints
    protect_full_nodes: bool = False


POLICIES: dict[str, QueuePolicy] = {
    "fifo": QueuePolicy("fifo", "submit", strict=True),
    "fifo-backfill": QueuePolicy("fifo-backfill", "submit", reserve=True),
    "sjf-oracle": QueuePolicy("sjf-oracle", "duration", oracle=True),
    "srtf-oracle": QueuePolicy("srtf-oracle", "remaining", preemptive=True, oracle=True, preempt_ratio=1.0),
    "tiresias": QueuePolicy("tiresias", "las", preemptive=True),
    "kumiki": QueuePolicy(
        "kumiki",
        "forecast",
        reserve=True,
        backfill_on_reserved=True,
        preemptive=True,
        uses_forecast=True,
        starvation_s=STARVATION_S,
        protect_full_nodes=True,
    ),
    "kumiki-oracle": QueuePolicy(
        "kumiki-oracle",
        "forecast",
        reserve=True,
        backfill_on_reserved=True,
        preemptive=True,
        oracle=True,
        starvation_s=STARVATION_S,
        protect_full_nodes=True,
    ),
    "kumiki-noforecast": QueuePolicy(
        "kumiki-noforecast",
        "forecast",
        reserve=True,
        preemptive=True,
        starvation_s=STARVATION_S,
        protect_full_nodes=True,
    ),
}


def policy_named(name: str) -> QueuePolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None


def tiresias_level(attained_gpu_s: float) -> int:
    for level, threshold in enumerate(TIRESIAS_THRESHOLDS_GPU_S):
        if attained_gpu_s < threshold:
            return level
    return len(TIRESIAS_THRESHOLDS_GPU_S)


def estimate_remaining(policy: QueuePolicy, view: JobView, executed_s: float, *, pessimistic: bool = False) -> float:
    """Expected remaining run time as the policy sees it (oracles: the truth, reduced by time run since)."""
    if policy.oracle:
        if not isinstance(view, OracleJobView):
            raise TypeError(f"oracle policy {policy.name} needs OracleJobView")
        return max(0.0, view.remaining_s - (executed_s - view.executed_s))
    forecast = view.forecast if policy.uses_forecast else None
    if forecast is None:
        return max(executed_s, NO_FORECAST_FLOOR_S)
    p50 = forecast.p50_s
    p90 = max(forecast.p90_s, p50)
    if not pessimistic and executed_s < p50:
        return p50 - executed_s
    if executed_s < p90:
        return p90 - executed_s
    # beyond its p90 a heavy-tailed job is expected to run about as long again
    return executed_s


def waiting_key(policy: QueuePolicy, view: JobView) -> float:
    """The ordering key of a waiting job (lower first); ties break by submit time then arrival order."""
    if policy.order == "submit":
        return view.submit_s
    if policy.order == "duration":
        if not isinstance(view, OracleJobView):
            raise TypeError(f"oracle policy {policy.name} needs OracleJobView")
        return view.remaining_s + view.executed_s
    if policy.order == "las":
        return float(tiresias_level(view.attained_gpu_s))
    if policy.order == "las-forecast":
        return LEVEL_SPAN_S * tiresias_level(view.attained_gpu_s) + min(
            estimate_remaining(policy, view, view.executed_s), LEVEL_SPAN_S - 1.0
        )
    return estimate_remaining(policy, view, view.executed_s)


def running_rank(policy: QueuePolicy, view: JobView, executed_s: float, attained_gpu_s: float) -> float:
    """The same scale as `waiting_key` for a running job now: a victim must rank worse than the job it yields to."""
    if policy.order == "las":
        return float(tiresias_level(attained_gpu_s))
    if policy.order == "las-forecast":
        return LEVEL_SPAN_S * tiresias_level(attained_gpu_s) + min(
            estimate_remaining(policy, view, executed_s), LEVEL_SPAN_S - 1.0
        )
    if policy.order in ("remaining", "forecast"):
        return estimate_remaining(policy, view, executed_s)
    return view.submit_s
