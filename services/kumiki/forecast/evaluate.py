"""Replay a trace through forecasters the way a live cluster would see it, and score them (pure).

Jobs are replayed in submit order. Before a job is forecast, every job that finished strictly
before its submit time (finish = submit + duration: the trace has no queueing) is observed; no
other duration is ever handed to a forecaster, and `JobFeatures` has no duration field at all.
Every job is forecast (the forecasters learn from their own issued forecasts), but only jobs
submitted in [start_s, end_s) are scored; earlier jobs only train.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.models import log_runtime, median, model_factories
from kumiki.sched.forecasting import JobFeatures, RuntimeForecaster, tell_started
from kumiki.sim.trace import DAY_S, TraceJob

ForecasterFactory = Callable[[], RuntimeForecaster]
BASELINES = ("global-median", "last-two")
Progress = Callable[[int, int], None]


def baseline_factories() -> dict[str, ForecasterFactory]:
    return {"global-median": GlobalMedianSoFar, "last-two": LastTwoSameKey}


def default_factories() -> dict[str, ForecasterFactory]:
    """Kumiki's models first, then the baselines; names are the report's model names."""
    return {**model_factories(), **baseline_factories()}


def job_features(job: TraceJob) -> JobFeatures:
    """What a live cluster knows at submit; the trace's `model` column is the job's name/image."""
    if job.submit_s is None:
        raise ValueError(f"job {job.job_id} has no submit time")
    return JobFeatures(
        job_id=job.job_id,
        queue=job.queue,
        user=job.user,
        gpus=job.gpus,
        name=job.model,
        submit_s=job.submit_s,
        image=job.image,
        command=job.command,
        time_limit_s=job.time_limit_s,
    )


@dataclass(frozen=True, slots=True)
class Prediction:
    job_id: str
    model: str
    p50_s: float
    p90_s: float
    actual_s: float
    chosen: str  # the model name the forecaster reported (e.g. which expert)
    submit_s: float
    queue: str = ""


@dataclass(frozen=True, slots=True)
class ModelScore:
    jobs: int
    median_abs_log_error: float
    mae_s: float
    p90_coverage: float
    # Kendall's tau-b between the p50s and the run times: how well the forecasts *order* the jobs, which is
    # what a scheduler's order uses and what a median error can flatter (nan: fewer than two jobs, or one side
    # all tied)
    rank_agreement: float = math.nan

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "jobs": self.jobs,
            "median_abs_log_error": finite_or_none(self.median_abs_log_error),
            "mae_s": finite_or_none(self.mae_s),
            "p90_coverage": finite_or_none(self.p90_coverage),
            "rank_agreement": finite_or_none(self.rank_agreement),
        }


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN or infinity: an undefined score is null."""
    return value if math.isfinite(value) else None


def rank_agreement(forecasts: Sequence[float], actuals: Sequence[float]) -> float:
    """Kendall's tau-b of two paired samples (O(n log n)); nan when undefined."""
    if len(forecasts) < 2 or len(set(forecasts)) < 2 or len(set(actuals)) < 2:
        return math.nan
    from scipy.stats import kendalltau  # deferred: scipy takes a second to import

    return float(kendalltau(forecasts, actuals).statistic)


@dataclass(frozen=True, slots=True)
class Evaluation:
    predictions: tuple[Prediction, ...]
    scores: dict[str, ModelScore]
    trained_only: int  # jobs before start_s: observed, not scored
    skipped: int  # jobs without a submit time or duration: cannot be replayed


def replayable(jobs: Sequence[TraceJob]) -> tuple[list[TraceJob], int]:
    """Jobs with both a submit time and a duration, in submit order (file order breaks ties)."""
    usable = [job for job in jobs if job.submit_s is not None and job.duration_s is not None]
    order = sorted(range(len(usable)), key=lambda index: (usable[index].submit_s or 0.0, index))
    return [usable[index] for index in order], len(jobs) - len(usable)


def score(predictions: Sequence[Prediction]) -> ModelScore:
    if not predictions:
        return ModelScore(0, math.nan, math.nan, math.nan)
    log_errors = [abs(log_runtime(p.p50_s) - log_runtime(p.actual_s)) for p in predictions]
    return ModelScore(
        jobs=len(predictions),
        median_abs_log_error=median(log_errors),
        mae_s=sum(abs(p.p50_s - p.actual_s) for p in predictions) / len(predictions),
        p90_coverage=sum(1 for p in predictions if p.actual_s <= p.p90_s) / len(predictions),
        rank_agreement=rank_agreement([p.p50_s for p in predictions], [p.actual_s for p in predictions]),
    )


def replay(
    jobs: Sequence[TraceJob],
    factories: Mapping[str, ForecasterFactory],
    *,
    start_s: float | None = None,
    end_s: float | None = None,
    progress: Progress | None = None,
) -> Evaluation:
    """Forecast every job at submit from the jobs finished before it; score those in [start_s, end_s)."""
    if not factories:
        raise ValueError("no models to evaluate")
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise ValueError(f"end_s ({end_s:g}) must be after start_s ({start_s:g})")
    ordered, skipped = replayable(jobs)
    if end_s is not None:
        ordered = [job for job in ordered if (job.submit_s or 0.0) < end_s]
    forecasters = {name: factory() for name, factory in factories.items()}
    # (finish_s, sequence, features, duration): the sequence keeps equal finish times in submit order.
    running: list[tuple[float, int, JobFeatures, float]] = []
    predictions: list[Prediction] = []
    trained_only = 0
    for sequence, job in enumerate(ordered):
        assert job.submit_s is not None and job.duration_s is not None
        now = job.submit_s
        while running and running[0][0] < now:
            finished_s, _, done, duration_s = heapq.heappop(running)
            for forecaster in forecasters.values():
                forecaster.observe(done, duration_s, finished_s)
        features = job_features(job)
        scored = start_s is None or now >= start_s
        for name, forecaster in forecasters.items():
            forecast = forecaster.predict(features)
            tell_started(forecaster, job.job_id, now)  # a trace job runs from its submit
            if scored:
                predictions.append(
                    Prediction(
                        job.job_id,
                        name,
                        forecast.p50_s,
                        forecast.p90_s,
                        job.duration_s,
                        forecast.model,
                        now,
                        job.queue,
                    )
                )
        trained_only += 0 if scored else 1
        heapq.heappush(running, (now + job.duration_s, sequence, features, job.duration_s))
        if progress is not None:
            progress(sequence + 1, len(ordered))
    scores = {name: score([p for p in predictions if p.model == name]) for name in forecasters}
    return Evaluation(tuple(predictions), scores, trained_only, skipped)


def scores_by(
    predictions: Sequence[Prediction], group: Callable[[Prediction], str]
) -> dict[str, dict[str, ModelScore]]:
    """Scores per group (e.g. per day, per queue) and model, groups in first-seen order."""
    grouped: dict[str, dict[str, list[Prediction]]] = {}
    for prediction in predictions:
        grouped.setdefault(group(prediction), {}).setdefault(prediction.model, []).append(prediction)
    return {label: {model: score(rows) for model, rows in models.items()} for label, models in grouped.items()}


def day_of(prediction: Prediction, origin_s: float = 0.0) -> int:
    return int((prediction.submit_s - origin_s) // DAY_S)


@dataclass(frozen=True, slots=True)
class WindowVerdict:
    """One window (a day, a queue) of a rolling-origin evaluation: the model against the better baseline."""

    label: str
    jobs: int
    model_error: float
    better_baseline: str
    baseline_error: float
    ratio: float  # model / better baseline median |log error|
    p90_coverage: float
    rank_agreement: float = math.nan  # the model's Kendall tau-b in this window
    baseline_rank_agreement: float = math.nan  # the better baseline's

    def as_dict(self) -> dict[str, float | int | str | None]:
        return {
            "label": self.label,
            "jobs": self.jobs,
            "median_abs_log_error": self.model_error,
            "better_baseline": self.better_baseline,
            "better_baseline_error": self.baseline_error,
            "ratio_to_better_baseline": self.ratio,
            "p90_coverage": self.p90_coverage,
            "rank_agreement": finite_or_none(self.rank_agreement),
            "better_baseline_rank_agreement": finite_or_none(self.baseline_rank_agreement),
        }


def verdicts(
    grouped: Mapping[str, Mapping[str, ModelScore]], model: str = "kumiki", baselines: Sequence[str] = BASELINES
) -> list[WindowVerdict]:
    """Per window: `model`'s error, the better baseline's, their ratio and the model's coverage."""
    out: list[WindowVerdict] = []
    for label, scores in grouped.items():
        if model not in scores:
            continue
        present = [(name, scores[name].median_abs_log_error) for name in baselines if name in scores]
        present = [(name, value) for name, value in present if math.isfinite(value)]
        if not present:
            continue
        best_name, best = min(present, key=lambda item: item[1])
        own = scores[model]
        ratio = own.median_abs_log_error / best if best > 0 else math.inf
        out.append(
            WindowVerdict(
                label,
                own.jobs,
                own.median_abs_log_error,
                best_name,
                best,
                ratio,
                own.p90_coverage,
                own.rank_agreement,
                scores[best_name].rank_agreement,
            )
        )
    return out


def rolling_origin(evaluation: Evaluation, origin_s: float = 0.0) -> dict[str, dict[str, ModelScore]]:
    """Per day of submit (day 0 from `origin_s`): every day is scored on forecasts made from the days before.

    The replay is online, so a day's forecasts were issued with exactly the jobs that finished before
    each submit: the rolling origin "train on every earlier day, test on the next" at the finest grain.
    """
    return scores_by(evaluation.predictions, lambda p: f"day {day_of(p, origin_s)}")


def warm_up(forecaster: RuntimeForecaster, jobs: Sequence[TraceJob], until_s: float) -> int:
    """Teach a forecaster the history a live cluster would hold at `until_s`: jobs submitted before it are
    forecast at submit and learned from when they finished (strictly) before it, in time order. Returns the
    number learned. Used to start a simulation of a later window with the forecaster of the days before."""
    ordered, _ = replayable(jobs)
    running: list[tuple[float, int, JobFeatures, float]] = []
    learned = 0

    def drain(now: float) -> None:
        nonlocal learned
        while running and running[0][0] < now:
            finished_s, _, done, duration_s = heapq.heappop(running)
            forecaster.observe(done, duration_s, finished_s)
            learned += 1

    for sequence, job in enumerate(ordered):
        assert job.submit_s is not None and job.duration_s is not None
        if job.submit_s >= until_s:
            break
        drain(job.submit_s)
        features = job_features(job)
        forecaster.predict(features)
        tell_started(forecaster, job.job_id, job.submit_s)
        heapq.heappush(running, (job.submit_s + job.duration_s, sequence, features, job.duration_s))
    drain(until_s)
    return learned
