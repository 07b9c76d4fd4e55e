"""Synthetic distribution shifts on a real trace: how the default forecaster follows them, day by day.

    .venv/bin/python benchmarks/forecast_shifts.py [--trace philly-slice]

Two shifts applied to the trace (durations only; no job is added or removed):
- "x10": every run time of the busiest queue is multiplied by 10 from the middle of the trace on;
- "new VC": the second busiest queue's jobs from the middle on are renamed to a queue never seen before.
Each is replayed online; the shifted jobs are scored per day after the shift, `kumiki` against both
baselines (median |log error| and p90 coverage).
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter

from _support import trace_jobs

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.evaluate import DAY_S, replay, scores_by
from kumiki.forecast.models import build_default_forecaster


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
    print("| shift | day | jobs | kumiki | global-median | last-two | kumiki / better | kumiki p90 coverage |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, shifted in shifts.items():
        evaluation = replay(shifted, factories, start_s=middle)
        queue = targets[label]
        mine = [p for p in evaluation.predictions if p.queue == queue]
        for day, scores in scores_by(mine, lambda p: f"{int(p.submit_s // DAY_S)}").items():
            better = min(scores["global-median"].median_abs_log_error, scores["last-two"].median_abs_log_error)
            own = scores["kumiki"]
            print(
                f"| {label} ({queue}) | {day} | {own.jobs} | {own.median_abs_log_error:.3f} | "
                f"{scores['global-median'].median_abs_log_error:.3f} | {scores['last-two'].median_abs_log_error:.3f} | "
                f"{own.median_abs_log_error / better:.2f} | {100 * own.p90_coverage:.0f}% |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
