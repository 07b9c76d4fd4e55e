"""Summaries of simulation runs: report.json, report.md and PNG plots."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kumiki.sim.engine import SimResult
from kumiki.sim.gate import share_on

# the Kumiki policies that order by forecasts, whose recovered share a report gives when its runs are there
FORECAST_ORDERED = ("kumiki", "kumiki-gated", "kumiki-trust")

REPORT_KEYS = (
    "jobs",
    "avg_jct_s",
    "p50_jct_s",
    "p95_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "makespan_s",
    "gpu_utilization",
    "preemptions",
    "lost_gpu_hours",
)


# run-time classes of `job_class` (upper bounds, s): minutes, up to an hour, up to a working day, longer
RUNTIME_CLASSES = ((600.0, "< 10 min"), (3600.0, "10 min - 1 h"), (21600.0, "1 - 6 h"), (float("inf"), ">= 6 h"))
# report order of `job_class` labels: by run time, then by size ("1 GPU" < "2-7 GPUs" < ">= 8 GPUs" as text)
_RUNTIME_RANK = {label: index for index, (_, label) in enumerate(RUNTIME_CLASSES)}


def _class_order(label: str) -> tuple[int, str]:
    runtime, _, size = label.partition(", ")
    return _RUNTIME_RANK[runtime], size


def runtime_class(duration_s: float) -> str:
    return next(label for bound, label in RUNTIME_CLASSES if duration_s < bound)


def size_class(gpus: int, large_gpus: int = 8) -> str:
    return "1 GPU" if gpus <= 1 else f">= {large_gpus} GPUs" if gpus >= large_gpus else f"2-{large_gpus - 1} GPUs"


def job_class(duration_s: float, gpus: int, large_gpus: int = 8) -> str:
    """A job's class by its own run time and its size: who pays for or gains from an order is seldom a queue
    alone (on the Philly slice the forecasts' cost sits in 1-6 h single-GPU jobs, spread over queues)."""
    return f"{runtime_class(duration_s)}, {size_class(gpus, large_gpus)}"


def _group_means(groups: Mapping[str, Sequence[float]]) -> dict[str, dict[str, float | int]]:
    return {group: {"jobs": len(values), "avg_jct_s": float(np.mean(values))} for group, values in groups.items()}


def summarize(result: SimResult, *, large_gpus: int = 8) -> dict[str, Any]:
    """The report.json entry of one policy; percentiles are numpy's linear interpolation."""
    jobs = result.jobs
    if not jobs:
        return {key: 0 for key in REPORT_KEYS}
    jct = np.array([job.jct_s for job in jobs])
    first_submit = min(job.submit_s for job in jobs)
    makespan = max(job.finish_s for job in jobs) - first_submit
    large = np.array([job.jct_s for job in jobs if job.gpus >= large_gpus])
    queues: dict[str, list[float]] = {}
    classes: dict[str, list[float]] = {}
    for job in jobs:
        queues.setdefault(job.queue, []).append(job.jct_s)
        classes.setdefault(job_class(job.duration_s, job.gpus, large_gpus), []).append(job.jct_s)
    return {
        "jobs": len(jobs),
        "avg_jct_s": float(jct.mean()),
        "p50_jct_s": float(np.percentile(jct, 50)),
        "p95_jct_s": float(np.percentile(jct, 95)),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "avg_queue_s": float(np.mean([job.queue_s for job in jobs])),
        "makespan_s": float(makespan),
        "gpu_utilization": float(result.busy_gpu_s / (result.total_gpus * makespan)) if makespan > 0 else 0.0,
        "preemptions": int(sum(job.preemptions for job in jobs)),
        "lost_gpu_hours": float(sum(job.lost_gpu_s for job in jobs) / 3600.0),
        "checkpoint_gpu_hours": float(sum(job.checkpoint_gpu_s for job in jobs) / 3600.0),
        f"large_jobs_ge_{large_gpus}_gpus": len(large),
        "p99_jct_large_s": float(np.percentile(large, 99)) if len(large) else 0.0,
        "avg_jct_large_s": float(large.mean()) if len(large) else 0.0,
        "events": result.events,
        **({"gate_on_share": share_on(result.gate_looks)} if result.gate_looks else {}),
        **_idle_summary(result, makespan),
        "per_queue": _group_means(dict(sorted(queues.items()))),
        "per_class": _group_means({label: classes[label] for label in sorted(classes, key=_class_order)}),
    }


def _idle_summary(result: SimResult, makespan_s: float) -> dict[str, Any]:
    """With zombies (`SimJobSpec.idle`): what they held, what was done about it, and the JCT of the jobs that
    compute apart from theirs (idle reclaim lengthens a zombie's to shorten the others'). Nothing without."""
    idle = [job for job in result.jobs if job.idle]
    if not idle:
        return {}
    computing = [job.jct_s for job in result.jobs if not job.idle]
    capacity_s = result.total_gpus * makespan_s
    return {
        "idle_jobs": len(idle),
        "idle_gpu_hours": result.idle_gpu_s / 3600.0,
        "idle_found": result.idle_found,
        "idle_reclaimed": result.idle_reclaimed,
        "computing_utilization": (result.busy_gpu_s - result.idle_gpu_s) / capacity_s if capacity_s > 0 else 0.0,
        "avg_jct_computing_s": float(np.mean(computing)) if computing else 0.0,
        "avg_jct_idle_s": float(np.mean([job.jct_s for job in idle])),
    }


def idle_table(policies: Mapping[str, Mapping[str, Any]]) -> str:
    """Zombies per policy (rows without them are left out); empty when no run had any."""
    rows = {name: row for name, row in policies.items() if row.get("idle_jobs")}
    if not rows:
        return ""
    lines = [
        "| policy | zombies | idle GPU-h | found | reclaimed | computing GPU util | avg JCT, computing jobs s "
        "| avg JCT, zombies s |",
        "|" + "---|" * 8,
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['idle_jobs']:.0f} | {row['idle_gpu_hours']:,.1f} | {row['idle_found']:.0f} | "
            f"{row['idle_reclaimed']:.0f} | {row['computing_utilization']:.3f} | {row['avg_jct_computing_s']:,.0f} | "
            f"{row['avg_jct_idle_s']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def write_json(path: Path, report: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def markdown_table(policies: Mapping[str, Mapping[str, Any]], baseline: str | None = None) -> str:
    header = (
        "| policy | jobs | avg JCT s | p50 | p95 | p99 | p99 large | avg queue s | makespan s | GPU util "
        "| preempt | lost GPU-h |"
    )
    lines = [header, "|" + "---|" * 12]
    for name, row in policies.items():
        lines.append(
            f"| {name} | {row['jobs']} | {row['avg_jct_s']:,.0f} | {row['p50_jct_s']:,.0f} | "
            f"{row['p95_jct_s']:,.0f} | "
            f"{row['p99_jct_s']:,.0f} | {row.get('p99_jct_large_s', 0):,.0f} | {row['avg_queue_s']:,.0f} | "
            f"{row['makespan_s']:,.0f} | {row['gpu_utilization']:.3f} | {row['preemptions']} | "
            f"{row['lost_gpu_hours']:,.1f} |"
        )
    if baseline and baseline in policies:
        base = policies[baseline]["avg_jct_s"]
        lines.append("")
        lines.append(
            f"avg JCT relative to `{baseline}`: "
            + ", ".join(f"{name} {row['avg_jct_s'] / base:.3f}x" for name, row in policies.items())
        )
    return "\n".join(lines) + "\n"


def plot_results(results: Sequence[SimResult], out: Path) -> list[Path]:
    """JCT CDF, allocated GPUs and queue length over time, fragmentation over time (one PNG each)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jct = np.sort([job.jct_s for job in result.jobs])
        if len(jct):
            ax.plot(np.maximum(jct, 1.0), np.arange(1, len(jct) + 1) / len(jct), label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, "jct_cdf.png")

    for attribute, label, name in (
        ("allocated_gpus", "allocated GPUs", "allocated_gpus.png"),
        ("queue_length", "waiting jobs", "queue_length.png"),
        ("fragmented_gpus", "free GPUs no waiting job can use", "fragmentation.png"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        for result in results:
            times = np.array([sample.time_s for sample in result.samples]) / 3600.0
            values = np.array([getattr(sample, attribute) for sample in result.samples])
            ax.plot(times, values, label=result.policy, linewidth=0.8)
        if attribute == "allocated_gpus" and results:
            ax.axhline(results[0].total_gpus, color="black", linestyle=":", linewidth=0.8)
        ax.set_xlabel("time (h)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, name)
    return written


# Below this share of `kumiki-noforecast`'s average JCT, the oracle's gain is too small to split (a
# window where every order gives the same JCT): the recovered share is reported as None there.
MIN_ORACLE_GAIN = 0.005


def forecast_value(
    policies: Mapping[str, Mapping[str, Any]],
    *,
    forecast: str = "kumiki",
    without: str = "kumiki-noforecast",
    oracle: str = "kumiki-oracle",
) -> dict[str, Any] | None:
    """How much of the oracle's gain over no forecast the forecasts recover: (without - forecast) / (without - oracle).

    1: as good as true durations; 0: no better than no forecast; negative: the forecasts made the order worse.
    None when one of the three runs is missing.
    """
    if not all(name in policies for name in (forecast, without, oracle)):
        return None
    base = float(policies[without]["avg_jct_s"])
    own = float(policies[forecast]["avg_jct_s"])
    best = float(policies[oracle]["avg_jct_s"])
    gain = base - best
    share = (base - own) / gain if base > 0 and gain > MIN_ORACLE_GAIN * base else None
    return {
        "policy": forecast,
        "noforecast_avg_jct_s": base,
        "forecast_avg_jct_s": own,
        "oracle_avg_jct_s": best,
        "recovered_share": share,
    }


def recovered_shares(policies: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    """The recovered share of every forecast-ordered Kumiki policy in the runs (`kumiki`, `kumiki-gated`, ...)."""
    shares: dict[str, float | None] = {}
    for name in FORECAST_ORDERED:
        value = forecast_value(policies, forecast=name)
        if value is not None:
            shares[name] = value["recovered_share"]
    return shares


# the groups `forecast_cost` splits a run's jobs by: summarize's field and the report's name for a group
COST_GROUPS = {"queue": "per_queue", "class": "per_class"}


def forecast_cost(
    policies: Mapping[str, Mapping[str, Any]],
    *,
    by: str = "queue",
    forecast: str = "kumiki",
    without: str = "kumiki-noforecast",
) -> dict[str, float] | None:
    """Per group of jobs (`by`: "queue", or "class" of run time and size), what the forecasts added to the run's
    average JCT (s): the group's own JCT gap between the two runs weighed by its share of the jobs, so the values
    add up to the gap of the two averages. Positive: the forecasts cost that group's jobs time. One VC, or one
    kind of job, the forecasts serve worse than none hides in an average; here it is named. Largest cost first;
    None when a run or its per-group figures are missing."""
    if forecast not in policies or without not in policies:
        return None
    field = COST_GROUPS[by]
    own, base = policies[forecast].get(field), policies[without].get(field)
    total = sum(row["jobs"] for row in own.values()) if own else 0
    if not own or not base or not total:
        return None
    cost = {
        group: (row["avg_jct_s"] - base[group]["avg_jct_s"]) * row["jobs"] / total
        for group, row in own.items()
        if group in base
    }
    return _largest_first(cost)


def _largest_first(values: Mapping[str, float]) -> dict[str, float]:
    return dict(sorted(values.items(), key=lambda item: (-item[1], item[0])))


def over_seeds(by_seed: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """The same runs under several seeds (which order jobs submitted in the same second): per policy the mean
    average JCT and each seed's, and the recovered share of the means and of each seed.

    One seed's recovered share is a ratio of two small differences of chaotic runs (on the Philly slice at 48 x
    8, `kumiki-noforecast` alone moves by 7.6% from seed 0 to seed 1), so it is reported over seeds, not alone.
    Rows hold every numeric field the runs share, averaged, and `avg_jct_s_by_seed`; with one seed, that seed's
    numeric fields as they are.
    """
    seeds = list(by_seed)
    names = [name for name in by_seed[seeds[0]] if all(name in by_seed[seed] for seed in seeds)]
    policies: dict[str, dict[str, Any]] = {}
    for name in names:
        rows = [by_seed[seed][name] for seed in seeds]
        numeric = [
            key
            for key, value in rows[0].items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and all(key in row for row in rows)
        ]
        mean: dict[str, Any] = {key: sum(float(row[key]) for row in rows) / len(rows) for key in numeric}
        mean["avg_jct_s_by_seed"] = [float(row["avg_jct_s"]) for row in rows]
        policies[name] = mean
    by_seed_share = []
    for seed in seeds:
        value = forecast_value(by_seed[seed])
        by_seed_share.append(None if value is None else value["recovered_share"])
    costs = {by: _mean_cost([forecast_cost(by_seed[seed], by=by) for seed in seeds]) for by in COST_GROUPS}
    return {
        "seeds": seeds,
        "policies": policies,
        "forecast_value": forecast_value(policies),
        "recovered_share_by_policy": recovered_shares(policies),
        "recovered_share_by_seed": by_seed_share,
        "forecast_cost_by_queue": costs["queue"],
        "forecast_cost_by_class": costs["class"],
    }


def _mean_cost(costs: Sequence[dict[str, float] | None]) -> dict[str, float] | None:
    """The mean over seeds of each group's part; None unless every seed has one."""
    known = [each for each in costs if each is not None]
    if not known or len(known) < len(costs):
        return None
    groups = set.intersection(*(set(each) for each in known))
    return _largest_first({group: sum(each[group] for each in known) / len(known) for group in groups})


def seed_table(spread: Mapping[str, Any]) -> str:
    """One row per policy: each seed's average JCT, their mean and their spread ((max - min) / mean)."""
    seeds = spread["seeds"]
    lines = [
        "| policy | " + " | ".join(f"seed {seed}" for seed in seeds) + " | mean | spread |",
        "|---|" + "---:|" * (len(seeds) + 2),
    ]
    for name, row in spread["policies"].items():
        values = row["avg_jct_s_by_seed"]
        mean = row["avg_jct_s"]
        cells = " | ".join(f"{value:,.0f}" for value in values)
        lines.append(f"| {name} | {cells} | {mean:,.0f} | {(max(values) - min(values)) / mean:.1%} |")
    shares = spread.get("recovered_share_by_seed") or []
    if any(share is not None for share in shares):
        cells = " | ".join("n/a" if share is None else f"{share:.0%}" for share in shares)
        value = spread["forecast_value"]
        mean_share = None if value is None else value["recovered_share"]
        lines.append(f"| recovered share | {cells} | {'n/a' if mean_share is None else f'{mean_share:.0%}'} | |")
    return "\n".join(lines) + "\n"


def forecast_cost_table(
    whole: Mapping[str, float] | None, windows: Mapping[str, Mapping[str, Any]], *, by: str = "queue"
) -> str:
    """Groups (`by`: queue or job class) as rows, the whole run and each window as columns: what the forecasts
    added to the average JCT (`forecast_cost`, s); "" when there is nothing to compare."""
    columns: dict[str, Mapping[str, float]] = {}
    if whole:
        columns["whole run"] = whole
    for label, window in windows.items():
        if window.get(f"forecast_cost_by_{by}"):
            columns[label] = window[f"forecast_cost_by_{by}"]
    if not columns:
        return ""
    first = next(iter(columns.values()))
    queues = list(first) + sorted({queue for column in columns.values() for queue in column} - set(first))
    lines = [f"| {by} | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for queue in queues:
        cells = [f"{column[queue]:+,.1f}" if queue in column else "" for column in columns.values()]
        lines.append(f"| {queue} | " + " | ".join(cells) + " |")
    totals = [f"**{sum(column.values()):+,.1f}**" for column in columns.values()]
    lines.append("| **all (kumiki - kumiki-noforecast)** | " + " | ".join(totals) + " |")
    return "\n".join(lines) + "\n"


def window_table(windows: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per window: each policy's average JCT, the forecasts' recovered share, and ratios."""
    names: list[str] = []
    for window in windows.values():
        for name in window["policies"]:
            if name not in names:
                names.append(name)
    header = "| window | jobs | " + " | ".join(names) + " | recovered | x tiresias | x srtf-oracle |"
    lines = [header, "|" + "---|" * (len(names) + 5)]
    for label, window in windows.items():
        rows = window["policies"]
        cells = [f"{rows[name]['avg_jct_s']:,.0f}" if name in rows else "" for name in names]
        value = window.get("forecast_value") or {}
        share = value.get("recovered_share")
        kumiki = rows.get("kumiki", {}).get("avg_jct_s")

        def ratio(other: str, own: float | None = kumiki, rows: Mapping[str, Any] = rows) -> str:
            if own is None or other not in rows or not rows[other]["avg_jct_s"]:
                return ""
            return f"{own / rows[other]['avg_jct_s']:.3f}"

        lines.append(
            f"| {label} | {window['jobs']} | "
            + " | ".join(cells)
            + f" | {'n/a' if share is None else f'{100 * share:.0f}%'} | {ratio('tiresias')} | {ratio('srtf-oracle')} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class PairedChange:
    """How a change moved one figure over cells both runs share (weeks, loads, ...): its mean, a 95% interval for
    it, and how likely a mean as far from 0 is if the change did nothing (each cell's sign a coin toss)."""

    cells: int
    mean: float
    low: float
    high: float
    p_value: float
    better: int
    worse: int

    def decided(self, level: float = 0.05) -> bool:
        """Whether the change is told apart from the runs' own chaos at `level`."""
        return self.p_value < level


# the sign-flip test enumerates every sign pattern up to this many cells (2^16 means), and samples beyond it
_EXACT_CELLS = 16
_RESAMPLES = 20_000


def mean_interval(values: Sequence[float], *, seed: int = 0) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval for the mean of `values` (20,000 seeded resamples): how far the mean
    of these cells could move with other cells of the same kind."""
    if not values:
        raise ValueError("no values to take the mean of")
    draw = random.Random(seed)
    count = len(values)
    boot = sorted(sum(draw.choice(values) for _ in range(count)) / count for _ in range(_RESAMPLES))
    return boot[int(0.025 * (_RESAMPLES - 1))], boot[int(0.975 * (_RESAMPLES - 1))]


def paired_change(before: Sequence[float], after: Sequence[float], *, seed: int = 0) -> PairedChange:
    """The change `after - before` of one figure over paired cells (higher is better).

    Simulated schedules are chaotic: a week's recovered share moves by tens of points between ordering seeds, so a
    change measured on a handful of weeks is within that chaos unless its cells move together. A paired test says
    which: the interval is a percentile bootstrap of the mean change, the p-value a sign-flip test (exact up to
    16 cells, else 20,000 seeded draws). Neither assumes the changes are normal; both are deterministic."""
    if len(before) != len(after):
        raise ValueError(f"paired cells differ in number: {len(before)} before, {len(after)} after")
    if not before:
        raise ValueError("no cells to compare")
    changes = [b - a for a, b in zip(before, after, strict=True)]
    count = len(changes)
    mean = sum(changes) / count
    low, high = mean_interval(changes, seed=seed)
    exact = count <= _EXACT_CELLS
    if exact:  # every sign pattern, the observed one among them
        signs = [[1 if (pattern >> index) & 1 else -1 for index in range(count)] for pattern in range(2**count)]
    else:
        draw = random.Random(seed + 1)
        signs = [[draw.choice((1, -1)) for _ in range(count)] for _ in range(_RESAMPLES)]
    observed = abs(mean) - 1e-12
    extreme = sum(abs(sum(s * c for s, c in zip(sign, changes, strict=True))) / count >= observed for sign in signs)
    # sampled, the observed pattern counts as one draw more, so p is never 0
    p_value = extreme / len(signs) if exact else (extreme + 1) / (len(signs) + 1)
    return PairedChange(
        cells=count,
        mean=mean,
        low=low,
        high=high,
        p_value=p_value,
        better=sum(change > 0 for change in changes),
        worse=sum(change < 0 for change in changes),
    )
