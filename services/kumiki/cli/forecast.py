"""`kumiki forecast evaluate | demand`: score run-time forecasters and forecast queue demand on a trace.

`evaluate` is a contract others script against: DIR/report.json is
`{"models": {NAME: {"jobs", "median_abs_log_error", "mae_s", "p90_coverage", "rank_agreement"}}}`
(`rank_agreement`: Kendall's tau-b of p50s against run times, null where undefined) and DIR/predictions.csv
has `job_id,model,p50_s,p90_s` for every scored job and model.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from kumiki.cli.main import UsageError, message_console
from kumiki.forecast import demand as demand_model
from kumiki.forecast.evaluate import (
    Evaluation,
    Prediction,
    WindowVerdict,
    baseline_factories,
    default_factories,
    replay,
    rolling_origin,
    scores_by,
    verdicts,
)
from kumiki.sim.trace import TraceError, TraceJob, load_jobs

console = message_console()


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"expected finite seconds >= 0, got {value!r}")
    return number


def _hours(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole hours, got {value!r}") from None
    if not 1 <= number <= demand_model.MAX_HORIZON_HOURS:
        raise argparse.ArgumentTypeError(f"expected 1..{demand_model.MAX_HORIZON_HOURS} hours, got {number}")
    return number


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    forecast = subparsers.add_parser("forecast", help="evaluate run-time forecasters; forecast queue demand")
    commands = forecast.add_subparsers(dest="forecast_command", required=True, metavar="SUBCOMMAND")
    evaluate = commands.add_parser(
        "evaluate", help="replay a trace in submit order and score each model's forecasts (no look-ahead)"
    )
    evaluate.add_argument("--trace", required=True, help="job trace: CSV path or bundled name (philly-slice, ...)")
    evaluate.add_argument("--out", required=True, help="directory for report.json, predictions.csv, report.md, PNG")
    evaluate.add_argument("--start-s", type=_seconds, default=None, help="jobs submitted before this only train")
    evaluate.add_argument("--end-s", type=_seconds, default=None, help="jobs submitted from this on are ignored")
    evaluate.add_argument(
        "--models",
        default=None,
        help=f"comma-separated subset of {','.join(default_factories())} (default: all)",
    )
    evaluate.set_defaults(handler=_evaluate)
    demand = commands.add_parser("demand", help="per-queue arrivals and GPU-hours per hour: backtest and forecast")
    demand.add_argument("--trace", required=True, help="job trace: CSV path or bundled name (philly-slice, ...)")
    demand.add_argument("--out", required=True, help="directory for report.json, report.md and demand.png")
    demand.add_argument("--horizon-hours", type=_hours, default=24, help="hours to forecast past the trace's end")
    demand.add_argument("--holdout-hours", type=_hours, default=24, help="last hours of the trace held out to score")
    demand.set_defaults(handler=_demand)


def _load_trace(path: str) -> list[TraceJob]:
    """A CSV path or a bundled trace's name (`load_jobs` resolves it, as `kumiki simulate` does)."""
    try:
        jobs = load_jobs(path)
    except TraceError as error:
        raise UsageError(f"--trace: {error}") from None
    if not jobs:
        raise UsageError(f"--trace: {path} has no jobs")
    return jobs


def _out_dir(path: str) -> Path:
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out: {path} exists and is not a directory")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out: cannot create {path}: {error.strerror}") from None
    return folder


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _run_evaluation(jobs: Sequence[TraceJob], names: Sequence[str], args: argparse.Namespace) -> Evaluation:
    factories = default_factories()
    with _progress() as progress:
        task = progress.add_task(f"replaying {len(jobs)} jobs through {len(names)} models", total=len(jobs))

        def advance(done: int, total: int) -> None:
            if done % 200 == 0 or done == total:
                progress.update(task, completed=done, total=total)

        return replay(
            jobs,
            {name: factories[name] for name in names},
            start_s=args.start_s,
            end_s=args.end_s,
            progress=advance,
        )


def _model_names(option: str | None) -> list[str]:
    known = list(default_factories())
    if option is None:
        return known
    names = [name.strip() for name in option.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise UsageError(
            f"--models: unknown model(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}"
        )
    return list(dict.fromkeys(names))


def _evaluate(args: argparse.Namespace) -> int:
    if args.start_s is not None and args.end_s is not None and args.end_s <= args.start_s:
        raise UsageError(f"--end-s: must be after --start-s ({args.start_s:g}), got {args.end_s:g}")
    names = _model_names(args.models)
    jobs = _load_trace(args.trace)
    out = _out_dir(args.out)
    evaluation = _run_evaluation(jobs, names, args)
    report = {
        "models": {name: result.as_dict() for name, result in evaluation.scores.items()},
        "trace": str(args.trace),
        "start_s": args.start_s,
        "end_s": args.end_s,
        "trained_only_jobs": evaluation.trained_only,
        "skipped_jobs": evaluation.skipped,
        **_windows_report(evaluation, names),
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    _write_predictions(out / "predictions.csv", evaluation.predictions)
    (out / "report.md").write_text(_evaluation_markdown(evaluation, args), encoding="utf-8")
    _plot_evaluation(out / "forecast_errors.png", evaluation)
    _print_scores(evaluation)
    console.print(f"wrote {out}/report.json, predictions.csv, report.md, forecast_errors.png")
    return 0


def _windows_report(evaluation: Evaluation, names: Sequence[str]) -> dict[str, Any]:
    """Rolling origin (per day of submit) and per queue: every model's scores, and each Kumiki model
    against the better baseline of that window, with the spread over days (not one average)."""
    by_day = rolling_origin(evaluation)
    by_queue = scores_by(evaluation.predictions, lambda p: p.queue or "(none)")

    def table(grouped: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {label: {model: score.as_dict() for model, score in models.items()} for label, models in grouped.items()}

    comparisons: dict[str, Any] = {}
    for model in names:
        if model in baseline_factories():
            continue
        days = verdicts(by_day, model)
        # the first day has no earlier day to learn from: it is reported, not a rolling-origin test day
        tested = days[1:]
        ratios = [v.ratio for v in tested if math.isfinite(v.ratio)]
        coverage = [v.p90_coverage for v in tested]
        comparisons[model] = {
            "days": [{**v.as_dict(), "test_day": index > 0} for index, v in enumerate(days)],
            "queues": [v.as_dict() for v in verdicts(by_queue, model)],
            "ratio_spread": {"min": min(ratios), "mean": sum(ratios) / len(ratios), "max": max(ratios)}
            if ratios
            else None,
            "coverage_spread": {"min": min(coverage), "max": max(coverage)} if coverage else None,
        }
    return {"per_day": table(by_day), "per_queue": table(by_queue), "versus_better_baseline": comparisons}


def _write_predictions(path: Path, predictions: Sequence[Prediction]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["job_id", "model", "p50_s", "p90_s"])
        for prediction in predictions:
            writer.writerow([prediction.job_id, prediction.model, f"{prediction.p50_s:.3f}", f"{prediction.p90_s:.3f}"])


def _better_baseline(evaluation: Evaluation) -> tuple[str, float] | None:
    baselines = [
        (name, score.median_abs_log_error)
        for name, score in evaluation.scores.items()
        if name in baseline_factories() and math.isfinite(score.median_abs_log_error)
    ]
    return min(baselines, key=lambda item: item[1]) if baselines else None


def _evaluation_markdown(evaluation: Evaluation, args: argparse.Namespace) -> str:
    best = _better_baseline(evaluation)
    low = "-inf" if args.start_s is None else f"{args.start_s:g}"
    high = "inf" if args.end_s is None else f"{args.end_s:g}"
    window = f"[{low}, {high})"
    lines = [
        f"# Run-time forecast evaluation: {Path(args.trace).name}",
        "",
        f"Scored jobs submitted in {window} s; {evaluation.trained_only} earlier jobs only trained; "
        f"{evaluation.skipped} jobs without submit time or duration skipped.",
        "",
        "| model | jobs | median abs log error | vs better baseline | MAE (s) | p90 coverage | order (tau-b) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in evaluation.scores.items():
        versus = "n/a"
        if best is not None and best[1] > 0 and math.isfinite(result.median_abs_log_error):
            versus = f"{100.0 * (result.median_abs_log_error / best[1] - 1.0):+.1f}%"
        lines.append(
            f"| {name} | {result.jobs} | {result.median_abs_log_error:.3f} | {versus} | "
            f"{result.mae_s:,.0f} | {100.0 * result.p90_coverage:.1f}% | {_tau(result.rank_agreement)} |"
        )
    if best is not None:
        lines += ["", f"Better baseline here: {best[0]} ({best[1]:.3f})."]
    if "kumiki" in evaluation.scores:
        by_queue = verdicts(scores_by(evaluation.predictions, lambda p: p.queue or "(none)"), "kumiki")
        lines += [
            "",
            "## Rolling origin: each day scored on forecasts from the days before (kumiki vs the better baseline)",
            "",
            *_verdict_table("day", verdicts(rolling_origin(evaluation), "kumiki")),
            "",
            "## Per queue: kumiki against the better baseline on that queue's jobs (busiest first)",
            "",
            *_verdict_table("queue", sorted(by_queue, key=lambda verdict: -verdict.jobs)),
        ]
    return "\n".join(lines) + "\n"


def _verdict_table(window: str, rows: Sequence[WindowVerdict]) -> list[str]:
    lines = [
        f"| {window} | jobs | kumiki | better baseline | its error | ratio | p90 coverage | kumiki order "
        "(tau-b) | its order |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for verdict in rows:
        lines.append(
            f"| {verdict.label} | {verdict.jobs} | {verdict.model_error:.3f} | {verdict.better_baseline} | "
            f"{verdict.baseline_error:.3f} | {verdict.ratio:.2f} | {100.0 * verdict.p90_coverage:.1f}% | "
            f"{_tau(verdict.rank_agreement)} | {_tau(verdict.baseline_rank_agreement)} |"
        )
    return lines


def _tau(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "-"


def _print_scores(evaluation: Evaluation) -> None:
    table = Table(title="run-time forecasts")
    for column in ("model", "jobs", "median |log err|", "MAE s", "p90 coverage", "order (tau-b)"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, result in evaluation.scores.items():
        table.add_row(
            name,
            str(result.jobs),
            f"{result.median_abs_log_error:.3f}",
            f"{result.mae_s:,.0f}",
            f"{100.0 * result.p90_coverage:.1f}%",
            _tau(result.rank_agreement),
        )
    Console().print(table)


def _daily_errors(evaluation: Evaluation) -> dict[str, list[tuple[float, float]]]:
    """Per model: (day, median |log error| of the jobs submitted that day)."""
    from kumiki.forecast.models import log_runtime, median

    by_model_day: dict[str, dict[int, list[float]]] = {}
    for p in evaluation.predictions:
        errors = by_model_day.setdefault(p.model, {}).setdefault(int(p.submit_s // 86400), [])
        errors.append(abs(log_runtime(p.p50_s) - log_runtime(p.actual_s)))
    return {
        model: [(float(day), median(errors)) for day, errors in sorted(days.items())]
        for model, days in by_model_day.items()
    }


def _plot_evaluation(path: Path, evaluation: Evaluation) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(evaluation.scores)
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.5))
    errors = [evaluation.scores[name].median_abs_log_error for name in names]
    coverage = [100.0 * evaluation.scores[name].p90_coverage for name in names]
    left.bar(
        names,
        errors,
        color=["tab:blue" if name not in baseline_factories() else "tab:gray" for name in names],
    )
    left.set_ylabel("median |log error|")
    left.set_title("p50 error (lower is better)")
    left.tick_params(axis="x", rotation=30)
    middle.bar(names, coverage, color="tab:green")
    middle.axhspan(85, 95, color="tab:green", alpha=0.15, label="target 85-95%")
    middle.set_ylim(0, 100)
    middle.set_ylabel("% of jobs under p90")
    middle.set_title("p90 coverage")
    middle.tick_params(axis="x", rotation=30)
    middle.legend(loc="lower right")
    for model, points in _daily_errors(evaluation).items():
        right.plot([day for day, _ in points], [value for _, value in points], marker="o", label=model)
    right.set_xlabel("day of trace (submit)")
    right.set_ylabel("median |log error|")
    right.set_title("error by day")
    right.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _demand(args: argparse.Namespace) -> int:
    jobs = _load_trace(args.trace)
    out = _out_dir(args.out)
    arrivals = [
        demand_model.Arrival(job.queue, job.submit_s, job.gpus, job.duration_s)
        for job in jobs
        if job.submit_s is not None
    ]
    if not arrivals:
        raise UsageError(f"--trace: {args.trace} has no job with a submit time")
    start = min(arrival.submit_s for arrival in arrivals)
    end = max(arrival.submit_s for arrival in arrivals) + 1.0
    hourly = demand_model.hourly_demand(arrivals, start, end)
    hours = len(next(iter(hourly.values())).arrivals)
    if args.holdout_hours >= hours:
        raise UsageError(f"--holdout-hours: the trace spans {hours} h, hold out fewer, got {args.holdout_hours}")
    with _progress() as progress:
        task = progress.add_task(f"Holt-Winters per queue ({len(hourly)} queues)", total=2)
        scores = demand_model.backtest(hourly, args.holdout_hours)
        progress.update(task, advance=1)
        forecasts = demand_model.forecast_queues(hourly, args.horizon_hours)
        progress.update(task, advance=1)
    report = _demand_report(scores, forecasts, args)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_demand_markdown(report, args), encoding="utf-8")
    _plot_demand(out / "demand.png", hourly, scores, args.holdout_hours)
    console.print(f"wrote {out}/report.json, report.md, demand.png")
    return 0


def _demand_report(
    scores: Sequence[demand_model.BacktestScore],
    forecasts: Sequence[demand_model.QueueDemandForecast],
    args: argparse.Namespace,
) -> dict[str, Any]:
    backtest: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    totals: dict[str, dict[str, dict[str, float]]] = {}
    for item in scores:
        backtest.setdefault(item.queue, {}).setdefault(item.metric, {})[item.model] = {
            "mae_per_hour": item.mae,
            "used": item.used,
            "actual_total": item.actual_total,
            "predicted_total": sum(item.predicted),
        }
        summed = totals.setdefault(item.metric, {}).setdefault(item.model, {"mae": 0.0, "abs_total_error": 0.0})
        summed["mae"] += item.mae
        summed["abs_total_error"] += abs(sum(item.predicted) - item.actual_total)
    return {
        "trace": str(args.trace),
        "holdout_hours": args.holdout_hours,
        "horizon_hours": args.horizon_hours,
        "backtest_sum_over_queues": totals,
        "backtest": backtest,
        "forecast": {
            item.queue: {
                "arrivals_per_hour": list(item.arrivals_per_hour.values),
                "arrivals_model": item.arrivals_per_hour.model,
                "gpu_hours_per_hour": list(item.gpu_hours_per_hour.values),
                "gpu_hours_model": item.gpu_hours_per_hour.model,
            }
            for item in forecasts
        },
    }


def _demand_markdown(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"# Queue demand: {Path(args.trace).name}",
        "",
        f"Backtest: fit on all but the last {args.holdout_hours} h and forecast them. Summed over queues:",
        "mean absolute error per hour, and |predicted - actual| of the held-out total (lower is better).",
        "",
        "| metric | holt-winters MAE | mean MAE | seasonal naive MAE | HW total err | mean total err |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for metric, models in report["backtest_sum_over_queues"].items():
        lines.append(
            f"| {metric} | {models['holt-winters']['mae']:.2f} | {models['mean']['mae']:.2f} | "
            f"{models['seasonal-naive']['mae']:.2f} | {models['holt-winters']['abs_total_error']:.0f} | "
            f"{models['mean']['abs_total_error']:.0f} |"
        )
    lines += [
        "",
        "Holt-Winters works on log1p: it forecasts a typical hour (median-like), which bursty queues exceed;",
        "compare the predicted and actual totals before using it to size a reservation.",
        "",
        "| queue | metric | holt-winters | mean | seasonal naive | used | HW total | actual total |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for queue, metrics in report["backtest"].items():
        for metric, models in metrics.items():
            lines.append(
                f"| {queue} | {metric} | {models['holt-winters']['mae_per_hour']:.2f} | "
                f"{models['mean']['mae_per_hour']:.2f} | {models['seasonal-naive']['mae_per_hour']:.2f} | "
                f"{models['holt-winters']['used']} | {models['holt-winters']['predicted_total']:.1f} | "
                f"{models['holt-winters']['actual_total']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def _plot_demand(
    path: Path,
    hourly: dict[str, demand_model.HourlyDemand],
    scores: Sequence[demand_model.BacktestScore],
    holdout: int,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    busiest = sorted(hourly, key=lambda queue: -sum(hourly[queue].arrivals))[:4]
    figure, axes = plt.subplots(len(busiest), 2, figsize=(14, 2.8 * len(busiest)), squeeze=False)
    for row, queue in enumerate(busiest):
        for column, (metric, series) in enumerate(
            (("arrivals", hourly[queue].arrivals), ("gpu_hours", hourly[queue].gpu_hours))
        ):
            axis = axes[row][column]
            hours = list(range(len(series)))
            axis.plot(hours, series, color="black", linewidth=0.8, label="actual")
            first = len(series) - holdout
            for item in (s for s in scores if s.queue == queue and s.metric == metric):
                axis.plot(range(first, len(series)), item.predicted, label=f"{item.model}")
            axis.axvline(first, color="gray", linestyle=":")
            axis.set_title(f"{queue}: {metric.replace('_', '-')} per hour")
            axis.set_xlabel("hour of trace")
            if row == 0 and column == 0:
                axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
