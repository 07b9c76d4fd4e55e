"""Synthetic distribution shifts on a real trace: how the default forecaster follows them, day by day.

    .venv/bin/python benchmarks/forecast_shifts.py [--trace philly-slice]

Two shifts applied to the trace (durations only; no job is added or removed):
- "x10": every run time of the busiest queue is multiplied by 10 from the middle of the trace on;
- "new VC": the second busiest queue's jobs from the middle on are renamed to a queue never seen before.
Each is replayed online; the shifted jobs are scored per day after the shift, `kumiki` against both
baselines (median |log error| and p90 coverage), and against `kumiki` on the same jobs in the trace as it is
("unshifted"): the control that tells what the shift itself costs from what the forecaster does on that queue anyway.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter

from _support import trace_jobs

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.evaluate import DAY_S, Prediction, replay, score, scores_by
from kumiki.forecast.models import build_default_forecaster


def day_label(prediction: Prediction) -> str:
    return f"{int(prediction.submit_s // DAY_S)}"


def main() -> int:
    jobs = [job for job in trace_jobs(__doc__.splitlines()[0]) if job.submit_s is not None and job.duration_s]
    middle = (min(job.submit_s or 0.0 for job in jobs) + max(job.submit_s or 0.0 for job in jobs)) / 2.0
    busiest, second = (queue for queue, _ in Counter(job.queue for job in jobs).most_common(2))
    shifts = {
        "x10": [
            dataclasses.replace(job, duration_s=(job.duration_s or 0.0) * 10.0)
            if job.queue == busiest and (job.submit_s or 0.0) >= middle
            else job
            for job in jobs
        ],
        "new VC": [
            dataclasses.replace(job, queue="never-seen")
            if job.queue == second and (job.submit_s or 0.0) >= middle
            else job
            for job in jobs
        ],
    }
    targets = {"x10": busiest, "new VC": "never-seen"}
    factories = {"kumiki": build_default_forecaster, "global-median": GlobalMedianSoFar, "last-two": LastTwoSameKey}
    shifted_ids = {
        label: {job.job_id for job, was in zip(shifted, jobs, strict=True) if job != was}
        for label, shifted in shifts.items()
    }
    unshifted = {(p.job_id, p.model): p for p in replay(jobs, factories, start_s=middle).predictions}
    print(
        "| shift | day | jobs | kumiki | global-median | last-two | kumiki / better | kumiki p90 coverage "
        "| unshifted: kumiki | unshifted: kumiki / better |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, shifted in shifts.items():
        evaluation = replay(shifted, factories, start_s=middle)
        mine = [p for p in evaluation.predictions if p.job_id in shifted_ids[label]]
        for day, scores in scores_by(mine, day_label).items():
            better = min(scores["global-median"].median_abs_log_error, scores["last-two"].median_abs_log_error)
            own = scores["kumiki"]
            control = {
                name: score([unshifted[p.job_id, name] for p in mine if p.model == name and day_label(p) == day])
                for name in factories
            }
            control_better = min(control[name].median_abs_log_error for name in ("global-median", "last-two"))
            print(
                f"| {label} ({targets[label]}) | {day} | {own.jobs} | {own.median_abs_log_error:.3f} | "
                f"{scores['global-median'].median_abs_log_error:.3f} | {scores['last-two'].median_abs_log_error:.3f} | "
                f"{own.median_abs_log_error / better:.2f} | {100 * own.p90_coverage:.0f}% | "
                f"{control['kumiki'].median_abs_log_error:.3f} | "
                f"{control['kumiki'].median_abs_log_error / control_better:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
