"""Queue policies as data: how waiting jobs are ordered, and whether a policy blocks, reserves, backfills, preempts.

Every policy orders waiting jobs by a key that does not change while the job waits (so queues can
stay sorted incrementally). Only `*-oracle` policies read `OracleJobView.remaining_s`; the others
work from `JobView`, which has no duration.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import numpy as np

from kumiki.sched.forecasting import (
    UNINFORMED_LOG_SIGMA,
    UNINFORMED_P50_S,
    UNINFORMED_P90_S,
    WRONG_TAIL_SIGMA,
    WRONG_TAIL_WEIGHT,
    belief_survival,
)
from kumiki.sched.jobs import JobView, OracleJobView

# Tiresias' discretised attained-service levels, in GPU-seconds (Gu et al., NSDI'19 use a few queues
# with exponentially spaced thresholds).
TIRESIAS_THRESHOLDS_GPU_S = (3600.0, 36000.0, 360000.0)
# With no forecast a job's expected remaining time is taken as what it has already run (heavy tails),
# but never below this floor, so a fresh job is not treated as already finished.
NO_FORECAST_FLOOR_S = 600.0
# Without a forecast, `gittins` believes every job is drawn from one wide prior: median half an hour,
# p90 e^2 (~7x) above it (the forecaster's own cold-start prior; `kumiki.sched.forecasting`).
NO_FORECAST_P50_S = UNINFORMED_P50_S
NO_FORECAST_P90_S = UNINFORMED_P90_S
# A job waiting longer than this (since it was last queued) starves: it gets the reservation (large
# gangs first) and, where the policy says so, evicts jobs on one node to start.
STARVATION_S = 24 * 3600.0
# `kumiki`: a full-node job may be preempted (so it checkpoints) only during its first 6 h of progress;
# past that it holds its node, so the longest gangs pay at most 11 checkpoints (660 s).
KUMIKI_PROTECT_AFTER_S = 21600.0
# `gittins`: weight and width (sigma of log run time) of the wide log-normal mixed into every forecast,
# for the forecasts that are simply wrong (the Philly slice's longest job was forecast at 264 s)
GITTINS_TAIL_WEIGHT = WRONG_TAIL_WEIGHT
GITTINS_TAIL_SIGMA = WRONG_TAIL_SIGMA
# `las-forecast` keys: the attained-service level dominates, the forecast orders jobs inside a level.
LEVEL_SPAN_S = 1e9


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """How a policy behaves. `order`: submit | duration | remaining | las | las-forecast | forecast | gittins."""

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
    # preemption: when both jobs' forecasts carry a measured error (`error_sigma`), the rank margin is read off
    # the two (`preempt_margin`) instead of the fixed `preempt_ratio`, which stays the margin without them
    spread_margin: bool = False
    # with `spread_margin`: a victim past its p90 by its own measured error is ranked by what it has run, as
    # without a forecast, so its margin is at most `preempt_ratio` (False: the error's margin whatever it has run)
    cap_margin_past_forecast: bool = True
    # with `spread_margin`: the error's margin multiplies `preempt_ratio` (the margin kept on exact run times,
    # `kumiki-oracle`'s: what an eviction costs beyond the ranks) instead of replacing it (False: the ninth
    # step's margin, near 1 for well-forecast keys)
    spread_over_ratio: bool = True
    # never preempt jobs that fill a node or more (reservations protect them instead), so they need
    # no periodic checkpoints
    protect_full_nodes: bool = False
    # protected full-node jobs checkpoint (and may be preempted) during their first this many seconds of
    # progress, then never again; 0: never checkpoint, and yield only within the first interval (losing it)
    protect_after_s: float = 0.0
    # a job starving (waiting `starvation_s` since it was queued) evicts jobs on one node, whatever its
    # shape (without this: full-node gangs only, others get a reservation); which ones: `starvation_by_rank`
    starvation_preempts: bool = False
    # a starving job smaller than the largest node evicts the jobs the order values least (`rescue_order`),
    # not the cheapest to stop; a larger one clears the node that loses least work either way
    starvation_by_rank: bool = False
    # `gittins` order: weight and width of the wide log-normal mixed into each forecast
    tail_weight: float = GITTINS_TAIL_WEIGHT
    tail_sigma: float = GITTINS_TAIL_SIGMA
    # `gittins` order: sigma of log run time around the forecast median; 0: the forecast's own `log_sigma`
    # when it gives one (and `use_log_sigma`), else read off its p90
    forecast_sigma: float = 0.0
    use_log_sigma: bool = True
    # `gittins` order: the belief's sigma is the forecast's `error_sigma` (its key's honest error spread,
    # bias included) when given, so the order turns attained-service-like where the key's forecasts are wrong
    use_error_sigma: bool = False
    # `gittins` order: rank x GPUs^gpu_exponent (0: per job, 1: GPU-seconds as in 2D-LAS)
    gpu_exponent: float = 0.0
    # `gittins` order: weigh the forecast by its `trust` (the forecaster's measured record on the job's key),
    # falling back to the forecast-free rank as trust falls; False: every forecast fully trusted
    use_trust: bool = True
    # with trust: update the forecast's weight by the job's survival so far (Bayes); False: fixed weight
    trust_update: bool = True
    # use the forecasts only while replaying the past with and without them says they shortened the last day
    # (`kumiki.sim.gate`; the simulator runs it)
    gate_forecasts: bool = False
    # a gang blocked only by fragmentation (enough free GPUs, scattered) may move small jobs off the nodes it
    # needs (checkpoint, evict, requeue) when its expected wait saved outweighs their lost work
    # (`kumiki.sched.preemption.move_value`); needs a preemptive policy
    defragment: bool = False


# Kumiki: Gittins-index order on the forecast distribution, per GPU-second; preemption past a margin the two
# forecasts' errors set (`preempt_margin`), re-examined as running jobs age; every single-node job stays
# preemptible (and checkpointing), as in Tiresias; a job waiting 24 h evicts the jobs the order values least.
# Measured choices: docs/simulator.md.
KUMIKI = QueuePolicy(
    "kumiki",
    "gittins",
    reserve=False,
    backfill_on_reserved=True,
    preemptive=True,
    uses_forecast=True,
    starvation_s=STARVATION_S,
    preempt_ratio=4.0,
    # The margin a victim's rank must clear is the 4x kept on exact run times times the two forecasts' own
    # measured error (`preempt_margin`): keys forecast badly hardly evict by rank at all. The error's margin
    # alone raised the recovered share over 18 load and VC-mix cells of the slice from 38% to 43% (loads) and
    # 13% to 19% (mixes) against the fixed 4x (docs/design/0003-forecast-trust.md, ninth step; re-checked on 18
    # stand-in weeks, +18.8 points, 95% interval +9.5 to +29.6, 15 of 18 weeks better); on top of the
    # 4x (`spread_over_ratio`) it raised the mean share over 20 load, shift and mix cells from 34.7% to 39.3%
    # and stopped jobs forecast well being evicted again and again (fifteenth step; re-checked on 18 stand-in
    # weeks, +4.0 points, 95% interval -2.1 to +9.5: docs/simulator.md). A victim past its
    # forecast by its own error is held to at most the forecast-free 4x (`cap_margin_past_forecast`): without
    # that, reversed forecasts cost 17% against no forecasts at 48 x 8 (thirteenth step).
    spread_margin=True,
    # Protecting full-node jobs after 6 h (`kumiki-protect`) shortens the longest full-node jobs' tail (p99 of
    # >= 8-GPU jobs at 48 x 8: 1.91 million s against 2.46 million s) but costs every other job: it was what
    # put the forecast-free order 12% behind Tiresias at 48 x 8 (docs/design/0003-forecast-trust.md), so the
    # default is the average-JCT order and the tail protection is a choice.
    protect_full_nodes=False,
    starvation_preempts=True,
    # Under overload (the x10 shift) the cheapest victims were the jobs just started, which the order ranks
    # best, and then jobs the guard itself had started: starving jobs now take their room from the
    # lowest-ranked ones (docs/design/0003-forecast-trust.md, eleventh step). On the 18 stand-in weeks it costs
    # nothing: +2.3 points of recovered share (95% interval +0.3 to +4.7), all of it at 48 x 8.
    starvation_by_rank=True,
    gpu_exponent=1.0,
    # The Gittins belief's width is the key's measured error (`error_sigma`, bias included) where it has one, not
    # the forecast's own claimed spread (`log_sigma`, read from as few as 5 residuals, which reached 6-7 on keys
    # whose measured error was 1-3): on 18 other weeks built from the slice's days (48 and 64 x 8, seeds 0-2) the
    # recovered share rose from 31.4% to 34.1% and no week stayed behind no forecasts (one did); on the slice's
    # own order it fell from 48.4% to 41.1% (docs/design/0003-forecast-trust.md, seventeenth step).
    use_error_sigma=True,
    # Measured-trust mixing towards the forecast-free order (`kumiki-trust`) cost average JCT on the Philly slice
    # in every form tried: 9% when first measured, 0.3-0.9% now at 48 and 64 x 8, with trust measured by error
    # or by how well the forecasts order (docs/design/0003-forecast-trust.md, first and twelfth steps), so it is
    # off here.
    use_trust=False,
)

POLICIES: dict[str, QueuePolicy] = {
    "fifo": QueuePolicy("fifo", "submit", strict=True),
    "fifo-backfill": QueuePolicy("fifo-backfill", "submit", reserve=True),
    "sjf-oracle": QueuePolicy("sjf-oracle", "duration", oracle=True),
    "srtf-oracle": QueuePolicy("srtf-oracle", "remaining", preemptive=True, oracle=True, preempt_ratio=1.0),
    "tiresias": QueuePolicy("tiresias", "las", preemptive=True),
    "kumiki": KUMIKI,
    # as `kumiki` before issue 14: full-node jobs checkpoint (and may be preempted) only in their first 6 h
    "kumiki-protect": replace(
        KUMIKI, name="kumiki-protect", protect_full_nodes=True, protect_after_s=KUMIKI_PROTECT_AFTER_S
    ),
    "kumiki-oracle": replace(KUMIKI, name="kumiki-oracle", oracle=True, uses_forecast=False),
    # as `kumiki`, each forecast weighed by its `trust` (the forecaster's record on the job's key)
    "kumiki-trust": replace(KUMIKI, name="kumiki-trust", use_trust=True),
    # without forecasts there is nothing to backfill with: starving jobs' reserved nodes stay theirs
    "kumiki-noforecast": replace(KUMIKI, name="kumiki-noforecast", uses_forecast=False, backfill_on_reserved=False),
    # as `kumiki`, with the forecasts switched off while a replay of the past says they cost the last day time
    "kumiki-gated": replace(KUMIKI, name="kumiki-gated", gate_forecasts=True),
    # defragmentation moves on (docs/simulator.md compares them on the Philly slice)
    "kumiki-defrag": replace(KUMIKI, name="kumiki-defrag", defragment=True),
    "tiresias-defrag": QueuePolicy("tiresias-defrag", "las", preemptive=True, defragment=True),
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


def preempt_margin(policy: QueuePolicy, waiting: JobView, victim: JobView, victim_executed_s: float) -> float:
    """How many times the waiting job's rank a victim's must exceed (before lost work) to be preempted for it.

    On exact run times the policy evicts only past the fixed `preempt_ratio` (4: `kumiki-oracle`), because an
    eviction costs more than the unsaved work it counts (the restore, the requeue behind others, the next
    newcomer). Forecast ranks are estimates whose log errors have the forecasts' spreads, so the log of their
    ratio errs by the two spreads combined; evicting only past `preempt_ratio` x e^(Z90 x that) is evicting only
    when the victim is 90% likely to rank more than `preempt_ratio` times the newcomer (`spread_over_ratio`).
    Badly forecast keys then hardly evict by rank, which is where an eviction's cost exceeds what the
    reordering gains (issue 14's VC mixes). The ninth step's margin dropped the ratio (`spread_over_ratio`
    False): well-forecast keys then evicted near SRPT's margin of 1, more eagerly than on exact run times, and
    jobs forecast well were evicted again and again (issue 14, fifteenth step). Only a measured error counts
    (`error_sigma`, the key's record with its bias): a forecast's claimed spread (`log_sigma`, its p90) cannot
    make the policy evict more eagerly. Without a measured error on both
    sides: the policy's fixed, forecast-free `preempt_ratio`.

    A victim that has run past its p90 by its own measured error (`victim_executed_s` beyond p50 x
    e^(Z90 x error_sigma)) is a miss its forecast did not expect: its rank has grown with what it has run, as
    it would without a forecast, so its margin is at most the forecast-free `preempt_ratio`
    (`cap_margin_past_forecast`). Without that cap a key forecast badly enough (long jobs forecast short)
    could not be evicted by rank at all, however long it ran: reversed forecasts put `kumiki` 17% behind no
    forecasts at 48 x 8, and level with it under the cap (docs/design/0003-forecast-trust.md, thirteenth step)."""
    if not (policy.spread_margin and policy.uses_forecast and waiting.forecast and victim.forecast):
        return policy.preempt_ratio
    waiting_sigma, victim_sigma = waiting.forecast.error_sigma, victim.forecast.error_sigma
    if waiting_sigma is None or victim_sigma is None:
        return policy.preempt_ratio
    margin = math.exp(Z90 * math.hypot(waiting_sigma, victim_sigma))
    if policy.spread_over_ratio:
        margin *= policy.preempt_ratio
    if policy.cap_margin_past_forecast and victim_executed_s > victim.forecast.p50_s * math.exp(Z90 * victim_sigma):
        return min(margin, policy.preempt_ratio)
    return margin


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
    if policy.order == "gittins":
        return gittins_key(policy, view, view.executed_s)
    return estimate_remaining(policy, view, view.executed_s)


def admission_rank(policy: QueuePolicy, view: JobView, waiting_since_s: float, now: float) -> tuple[float, ...]:
    """Where a job quota holds back is asked in an admission round (placement's cycle; the simulator's).

    Quota answers in turn and each admission uses up what the next could have had, so the order decides who
    gets freed capacity first. The policy's own order (tier, then its key), as the queue would start them: by
    arrival instead, held jobs were admitted in submit order and the policy ordered only the few admitted: up to
    10% more average JCT on the Philly slice at 48 x 8, and never less on any day (benchmarks/sim_quota.py). A
    job held past the policy's starvation limit is asked first, longest waiting first, so that no held job waits
    for ever. `waiting_since_s` is the starvation clock the queue keeps too (`Scheduler.submit`'s `now`): since
    the attempt began to wait, its arrival or its previous attempt's eviction; from its arrival, a job evicted
    a day after it arrived would jump every round at once."""
    if policy.starvation_s > 0 and now - waiting_since_s >= policy.starvation_s:
        return (0.0, waiting_since_s)
    return (1.0, float(-view.priority), float(view.demoted), waiting_key(policy, view), view.submit_s)


def gittins_key(policy: QueuePolicy, view: JobView, executed_s: float) -> float:
    """Rank by the Gittins index of the forecast distribution (oracles: the true remaining time, i.e. SRPT).

    A forecast with `trust` w < 1 is one of two hypotheses: its own belief (weight w) or the uninformed
    prior the policy would use without it (1 - w). Having run `executed_s`, the job's survival updates
    that weight (Bayes: a job far past its forecast makes the prior likelier), and the rank is the
    weight-geometric mean of the two hypotheses' ranks, so w = 0 is exactly the forecast-free order
    (`kumiki-noforecast`) and w = 1 exactly the forecast's.
    """
    if policy.oracle:
        remaining = estimate_remaining(policy, view, executed_s)
        return remaining * view.gpus**policy.gpu_exponent if policy.gpu_exponent else remaining
    forecast = view.forecast if policy.uses_forecast else None
    trust = 1.0
    if forecast is None:
        p50, p90 = NO_FORECAST_P50_S, NO_FORECAST_P90_S
        trust = 0.0
    else:
        p50, p90 = forecast.p50_s, forecast.p90_s
        if policy.forecast_sigma:
            p90 = p50 * math.exp(Z90 * policy.forecast_sigma)
        elif policy.use_error_sigma and forecast.error_sigma is not None:
            p90 = p50 * math.exp(Z90 * forecast.error_sigma)
        elif policy.use_log_sigma and forecast.log_sigma is not None:
            p90 = p50 * math.exp(Z90 * forecast.log_sigma)
        if policy.use_trust and forecast.trust is not None:
            trust = min(1.0, max(0.0, forecast.trust))
    tail = {"tail_weight": policy.tail_weight, "tail_sigma": policy.tail_sigma}
    if trust > 0.0 and policy.trust_update:
        trust = posterior_trust(trust, p50, p90, executed_s)
    if trust >= 1.0 - 1e-6:
        rank = gittins_rank(p50, p90, executed_s, **tail)
    else:
        prior = gittins_rank(NO_FORECAST_P50_S, NO_FORECAST_P90_S, executed_s, **tail)
        if trust <= 1e-6:
            rank = prior
        else:
            rank = math.exp(
                trust * math.log(gittins_rank(p50, p90, executed_s, **tail)) + (1.0 - trust) * math.log(prior)
            )
    return rank * view.gpus**policy.gpu_exponent if policy.gpu_exponent else rank


def posterior_trust(trust: float, p50_s: float, p90_s: float, executed_s: float) -> float:
    """P(forecast hypothesis | the job has run `executed_s`) from its prior weight `trust` (Bayes on survival)."""
    if executed_s <= 0.0 or trust >= 1.0:
        return trust
    log_a = math.log(executed_s)
    ratio = max(p90_s / max(p50_s, 1e-3), 1.0 + 1e-9)
    informed = trust * belief_survival(log_a, math.log(max(p50_s, 1e-3)), math.log(ratio) / Z90)
    uninformed = (1.0 - trust) * belief_survival(log_a, math.log(NO_FORECAST_P50_S), UNINFORMED_LOG_SIGMA)
    total = informed + uninformed
    return informed / total if total > 0.0 else 0.0


def running_rank(policy: QueuePolicy, view: JobView, executed_s: float, attained_gpu_s: float) -> float:
    """The same scale as `waiting_key` for a running job now: a victim must rank worse than the job it yields to."""
    if policy.order == "las":
        return float(tiresias_level(attained_gpu_s))
    if policy.order == "las-forecast":
        return LEVEL_SPAN_S * tiresias_level(attained_gpu_s) + min(
            estimate_remaining(policy, view, executed_s), LEVEL_SPAN_S - 1.0
        )
    if policy.order == "gittins":
        return gittins_key(policy, view, executed_s)
    if policy.order in ("remaining", "forecast"):
        return estimate_remaining(policy, view, executed_s)
    return view.submit_s


# ---- Gittins index ------------------------------------------------------------------------------
# A job's run time S, as the policy believes it, is log-normal around its forecast (median p50, the
# p90 fixing sigma), mixed with a wide log-normal of weight GITTINS_TAIL_WEIGHT for the forecasts
# that are simply wrong. Having run `a`, its Gittins index is
#   G(a) = sup_{b > a} P(S <= b | S > a) / E[min(S, b) - a | S > a]
# (Gittins; Aalto, Ayesta & Righter 2009): serving the highest index minimises mean response time for
# sizes drawn from a known distribution. Its inverse, the rank, is in seconds: with a point mass it
# is exactly the remaining time (SRPT); past the forecast the wide tail takes over and the rank grows
# with attained service, as in least-attained-service. Log-normals are scale families, so the rank
# is p50 * R(sigma, log(a / p50)) with R tabulated once per tail setting.
Z90 = 1.2815515655446004
_SIGMAS = np.geomspace(0.02, 4.0, 41)
_LOG_SIGMAS = np.log(_SIGMAS)
_U_MIN, _U_MAX, _U_STEP = -12.0, 10.0, 0.05
_V_MAX = 18.0  # run times up to e^18 (6.6e7) p50s: "forever" for the sup over b
_FINE = 10  # integration points per table step


def _normal_survival(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * np.vectorize(math.erfc)(z / math.sqrt(2.0)), dtype=float)


def _rank_row(sigma: float, tail_weight: float, tail_sigma: float) -> np.ndarray:
    """log R(sigma, u) on the u grid: log of (1 / Gittins index) in units of p50."""
    step = _U_STEP / _FINE
    v = np.arange(_U_MIN - 4.0, _V_MAX + step / 2, step)
    survival = (1.0 - tail_weight) * _normal_survival(v / sigma)
    if tail_weight > 0:
        survival += tail_weight * _normal_survival(v / tail_sigma)
    x = np.exp(v)
    # C(x) = integral_0^x P(S > t) dt; below the grid S > t almost surely, so C(x_0) = x_0
    cumulative = np.concatenate(([x[0]], x[0] + np.cumsum(0.5 * (survival[1:] + survival[:-1]) * np.diff(x))))
    coarse = slice(None, None, _FINE)
    done, work = 1.0 - survival[coarse], cumulative[coarse]
    u_count = round((_U_MAX - _U_MIN) / _U_STEP) + 1
    first = round(4.0 / _U_STEP)
    rows = np.empty(u_count)
    for index in range(u_count):
        here = first + index
        gained = done[here + 1 :] - done[here]
        spent = work[here + 1 :] - work[here]
        ratio = np.divide(gained, spent, out=np.zeros_like(gained), where=spent > 0)
        rows[index] = -math.log(max(float(ratio.max()), 1e-300))
    return rows


@functools.lru_cache(maxsize=8)
def gittins_table(tail_weight: float, tail_sigma: float) -> tuple[tuple[float, ...], ...]:
    """log R over (sigma grid) x (u grid); built once per tail setting (~0.2 s). Plain tuples: scalar lookups
    in the scheduling hot path are several times faster than numpy indexing."""
    return tuple(tuple(float(value) for value in _rank_row(float(sigma), tail_weight, tail_sigma)) for sigma in _SIGMAS)


_LOG_SIGMA_MIN = float(_LOG_SIGMAS[0])
_LOG_SIGMA_MAX = float(_LOG_SIGMAS[-1])
_LOG_SIGMA_STEP = float(_LOG_SIGMAS[1] - _LOG_SIGMAS[0])
_U_LAST = round((_U_MAX - _U_MIN) / _U_STEP) - 1
_S_LAST = len(_SIGMAS) - 2


def gittins_rank(
    p50_s: float,
    p90_s: float,
    attained_s: float,
    *,
    tail_weight: float = GITTINS_TAIL_WEIGHT,
    tail_sigma: float = GITTINS_TAIL_SIGMA,
) -> float:
    """1 / Gittins index in seconds for a job believed to run ~LogNormal(p50, p90), having run `attained_s`."""
    p50 = max(p50_s, 1e-3)
    table = gittins_table(tail_weight, tail_sigma)
    ratio = p90_s / p50
    log_sigma = math.log(math.log(ratio) / Z90) if ratio > 1.0 + 1e-9 else _LOG_SIGMA_MIN
    log_sigma = min(max(log_sigma, _LOG_SIGMA_MIN), _LOG_SIGMA_MAX)
    u = math.log(attained_s / p50) if attained_s > 0 else _U_MIN
    scale = 1.0
    if u > _U_MAX:  # beyond the table the rank grows in proportion to attained service (a heavy tail)
        scale, u = math.exp(u - _U_MAX), _U_MAX
    u_pos = (max(u, _U_MIN) - _U_MIN) / _U_STEP
    s_pos = (log_sigma - _LOG_SIGMA_MIN) / _LOG_SIGMA_STEP
    s_index = min(int(s_pos), _S_LAST)
    u_index = min(int(u_pos), _U_LAST)
    s_frac, u_frac = s_pos - s_index, u_pos - u_index
    row, next_row = table[s_index], table[s_index + 1]
    low = row[u_index] + (row[u_index + 1] - row[u_index]) * u_frac
    high = next_row[u_index] + (next_row[u_index + 1] - next_row[u_index]) * u_frac
    return p50 * scale * math.exp(low + (high - low) * s_frac)
