"""Synthetic distribution shifts on a real trace: how the default forecaster follows them, day by day.

    .venv/bin/python benchmarks/forecast_shifts.py [--trace philly-slice]

Two shifts applied to the trace (`kumiki.sim.shifts`; no job is added or removed):
- "x10": every run time of the busiest queue is multiplied by 10 from the middle of the trace on;
- "new-vc": the second busiest queue's jobs from the middle on are renamed to a queue never seen before.
Each is replayed online; the shifted jobs are scored per day after the shift, `kumiki` against both
baselines (median |log error| and p90 coverage), and against `kumiki` on the same jobs in the trace as it is
("unshifted"): the control that tells what the shift itself costs from what the forecaster does on that queue anyway.
"""

from __future__ import annotations

import sys

from _support import trace_jobs

from kumiki.forecast.baselines import GlobalMedianSoFar, LastTwoSameKey
from kumiki.forecast.evaluate import Prediction, replay, score, scores_by
from kumiki.forecast.models import build_default_forecaster
from kumiki.sim.shifts import SHIFTS, shift_trace
from kumiki.sim.trace import DAY_S


def day_label(prediction: Prediction) -> str:
    return f"{int(prediction.submit_s // DAY_S)}"


def main() -> int:
    jobs = [job for job in trace_jobs(__doc__.splitlines()[0]) if job.submit_s is not None and job.duration_s]
    shifts = {name: shift_trace(jobs, name) for name in SHIFTS}
    middle = shifts["x10"].from_s
    factories = {"kumiki": build_default_forecaster, "global-median": GlobalMedianSoFar, "last-two": LastTwoSameKey}
    unshifted = {(p.job_id, p.model): p for p in replay(jobs, factories, start_s=middle).predictions}
    print(
        "| shift | day | jobs | kumiki | global-median | last-two | kumiki / better | kumiki p90 coverage "
        "| unshifted: kumiki | unshifted: kumiki / better |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, shift in shifts.items():
        evaluation = replay(shift.jobs, factories, start_s=middle)
        mine = [p for p in evaluation.predictions if p.job_id in shift.changed]
        for day, scores in scores_by(mine, day_label).items():
            better = min(scores["global-median"].median_abs_log_error, scores["last-two"].median_abs_log_error)
            own = scores["kumiki"]
            control = {
                name: score([unshifted[p.job_id, name] for p in mine if p.model == name and day_label(p) == day])
                for name in factories
            }
            control_better = min(control[name].median_abs_log_error for name in ("global-median", "last-two"))
            print(
                f"| {label} ({shift.target}) | {day} | {own.jobs} | {own.median_abs_log_error:.3f} | "
                f"{scores['global-median'].median_abs_log_error:.3f} | {scores['last-two'].median_abs_log_error:.3f} | "
                f"{own.median_abs_log_error / better:.2f} | {100 * own.p90_coverage:.0f}% | "
                f"{control['kumiki'].median_abs_log_error:.3f} | "
                f"{control['kumiki'].median_abs_log_error / control_better:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
