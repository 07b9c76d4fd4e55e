"""`kumiki simulate`: the trace-driven scheduling simulator."""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kumiki.cli.main import UsageError, message_console
from kumiki.cli.options import names_option, number_option, seeds_option, whole_number_option
from kumiki.sched.forecasting import RuntimeForecaster
from kumiki.sched.jobs import CheckpointModel
from kumiki.sched.placement import STRATEGIES
from kumiki.sched.policies import POLICIES
from kumiki.sim.shifts import SHIFTS, ShiftError, parse_day_order, reorder_days, shift_trace

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kumiki.quota.core import QuotaConfig
    from kumiki.sim.engine import SimJobSpec
    from kumiki.sim.scenarios import IdleReclaim, ProgressReports

DEFAULT_CHECKPOINT = CheckpointModel()

SIMULATE_EPILOG = f"""\
Checkpoint model (every preemptive policy pays the same): a job that its policy may preempt
checkpoints every {DEFAULT_CHECKPOINT.interval_s:g} s of progress, each checkpoint stopping it for
{DEFAULT_CHECKPOINT.checkpoint_cost_s:g} s; a preempted job loses the progress since its last checkpoint
and pays {DEFAULT_CHECKPOINT.restore_cost_s:g} s to restore. Placement is consolidated: a job of up to
one node's GPUs runs on one node, a larger one on whole nodes.
Policies: {", ".join(POLICIES)}. `kumiki` and `forecast-backfill` use kumiki.forecast.models.build_default_forecaster.
"""


def register(subparsers: Any) -> None:
    simulate = subparsers.add_parser(
        "simulate",
        help="replay a job trace against scheduling policies",
        description="Replay a job trace (a CSV path or a bundled name) on a simulated cluster under each policy.",
        epilog=SIMULATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    simulate.add_argument("--trace", required=True, help="job trace CSV")
    simulate.add_argument("--nodes", required=True, help="number of nodes")
    simulate.add_argument("--gpus-per-node", required=True, help="GPUs per node")
    simulate.add_argument("--policy", required=True, help=f"comma-separated policies ({', '.join(POLICIES)})")
    simulate.add_argument("--out", required=True, help="output directory")
    simulate.add_argument("--placement", default="best-fit", help=f"placement strategy ({', '.join(STRATEGIES)})")
    simulate.add_argument("--seed", default="0", help="orders jobs submitted at the same second (default 0)")
    simulate.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds: repeat every run (and day window) with each and report the spread over them"
        " (overrides --seed; the first one's runs give the per-run table and plots)",
    )
    simulate.add_argument("--start-s", default=None, help="only jobs submitted at or after this time")
    simulate.add_argument("--end-s", default=None, help="only jobs submitted before this time")
    simulate.add_argument("--queues", default=None, help="JSON/YAML mapping queue -> guaranteed GPUs (fair share)")
    simulate.add_argument(
        "--quota",
        default=None,
        metavar="TREE",
        help="a queue tree (the YAML `kumiki quota load` reads): every attempt is first admitted by the quota"
        " service's own core (limits, guarantees, borrowing, reclaim), as live; its capacity is lowered to the"
        " cluster's (docs/quota.md)",
    )
    simulate.add_argument("--nodes-per-rack", default="16", help="nodes per rack (default 16)")
    simulate.add_argument("--checkpoint-interval-s", default=str(DEFAULT_CHECKPOINT.interval_s))
    simulate.add_argument("--checkpoint-cost-s", default=str(DEFAULT_CHECKPOINT.checkpoint_cost_s))
    simulate.add_argument("--restore-cost-s", default=str(DEFAULT_CHECKPOINT.restore_cost_s))
    simulate.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    simulate.add_argument(
        "--day-windows",
        action="store_true",
        help="also simulate each day of the trace on its own (forecasters warmed on the days before)",
    )
    simulate.add_argument(
        "--shift",
        default=None,
        help=f"apply a synthetic distribution shift to the trace first ({', '.join(SHIFTS)}; kumiki.sim.shifts):"
        " x10 makes the busiest queue's run times 10x from the trace's middle on, new-vc renames the second"
        " busiest queue's jobs from then on to a queue never seen",
    )
    simulate.add_argument(
        "--day-order",
        default=None,
        help="replay another week built from the trace's days in this order, e.g. 3,6,5,2,0,4,1 (day k of the"
        " replay is day order[k] of the trace; 0 is its first day; each job keeps its time of day; after --shift)",
    )
    add_progress_options(simulate)
    simulate.add_argument(
        "--idle-fraction",
        default="0",
        help="a scenario the trace does not carry: the share of jobs (0 <= f < 1, drawn per job with the seed) that"
        " hold their GPUs for their whole run and compute nothing (zombies); default 0",
    )
    simulate.add_argument(
        "--idle-after-s",
        default="600",
        help="seconds a zombie's GPUs stay below 5%% before telemetry reports them idle (default 600)",
    )
    simulate.add_argument(
        "--idle-reclaim",
        default="*=waiting:0",
        metavar="RULES",
        help="what each queue does with a zombie telemetry found, as placement's KUMIKI_PLACEMENT_IDLE_RECLAIM:"
        " queue=never|after:SECONDS|waiting:SECONDS,... (`*`: every other queue; default `*=waiting:0`, the local"
        " stack's: reclaim while another job waits)",
    )
    simulate.set_defaults(handler=run_simulate)


def idle_from(args: argparse.Namespace) -> tuple[float, IdleReclaim]:
    """The --idle-* scenario, checked, errors naming the option: the zombies' share and what is done about them."""
    from kumiki.sched.idle import parse_idle_reclaim
    from kumiki.sim.scenarios import IdleReclaim

    share = number_option(args.idle_fraction, "--idle-fraction")
    after = number_option(args.idle_after_s, "--idle-after-s")
    assert share is not None and after is not None
    if share >= 1.0:
        raise UsageError(f"--idle-fraction must be < 1, got {args.idle_fraction}")
    if after <= 0:
        raise UsageError(f"--idle-after-s must be > 0, got {args.idle_after_s}")
    try:
        rules = parse_idle_reclaim(args.idle_reclaim)
    except ValueError as error:
        raise UsageError(f"--idle-reclaim: {error}") from None
    return share, IdleReclaim(after, rules)


def add_progress_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, prefix: str = "") -> None:
    """--progress-reports / --progress-share / --progress-noise, for `kumiki simulate` and the live replay (`kumiki
    replay`, and `kumiki up` as --replay-progress-*), which read them with `progress_reports_from`."""
    parser.add_argument(
        f"--{prefix}progress-reports",
        default=None,
        metavar="MIN_GPUS",
        help="a scenario the trace does not carry: jobs of at least MIN_GPUS GPUs report how far they have got"
        " (as a CheckpointReport's step / total_steps does live), and the forecaster forecasts them again from it"
        " (docs/design/0007-progress-reports.md); off by default",
    )
    parser.add_argument(
        f"--{prefix}progress-share",
        default="1",
        help=f"with --{prefix}progress-reports: the share of those jobs that report (0-1)",
    )
    parser.add_argument(
        f"--{prefix}progress-noise",
        default="0.2",
        help=f"with --{prefix}progress-reports: sigma of log(true run time / the run time a report implies), fixed"
        " per job",
    )


def progress_reports_from(args: argparse.Namespace, prefix: str = "", seed: int = 0) -> ProgressReports | None:
    """The --progress-* scenario, checked, errors naming the option (None: no job reports progress)."""
    from kumiki.sim.scenarios import ProgressReports

    def option(name: str) -> tuple[str, str | None]:
        value = getattr(args, (prefix + name).replace("-", "_"))
        return f"--{prefix}{name}", None if value is None else str(value)

    reports_option, min_gpus = option("progress-reports")
    if min_gpus is None:
        return None
    share_option, share_text = option("progress-share")
    noise_option, noise_text = option("progress-noise")
    share = number_option(share_text, share_option)
    noise = number_option(noise_text, noise_option)
    assert share is not None and noise is not None
    if share > 1.0:
        raise UsageError(f"{share_option} must be <= 1, got {share_text}")
    return ProgressReports(whole_number_option(min_gpus, reports_option, 1), share, noise, seed)


# ---- validation helpers ---------------------------------------------------------------------------
def load_queue_shares(path: str) -> dict[str, float]:
    """A mapping queue -> guaranteed GPUs, JSON or YAML; every value a positive number."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--queues: cannot read {path}: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise UsageError(f"--queues: {path} is not valid JSON or YAML: {error}") from None
    if isinstance(data, dict) and "queues" in data and isinstance(data["queues"], dict):
        data = data["queues"]
    if not isinstance(data, dict) or not data:
        raise UsageError(f"--queues: {path} must map queue names to guaranteed GPUs")
    shares: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, dict):
            value = value.get("guarantee")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UsageError(f"--queues: queue {name!r} needs a guaranteed GPU count > 0, got {value!r}")
        shares[str(name)] = float(value)
    return shares


def load_quota_tree(path: str, jobs: Sequence[SimJobSpec], total_gpus: int) -> QuotaConfig:
    """The --quota tree, checked against the trace: every job's queue a leaf, no job above a limit on its path."""
    import yaml

    from kumiki.quota.core import QueueConfigError, parse_config
    from kumiki.sim.quota import QuotaTreeError, check_jobs, cluster_tree

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise UsageError(f"--quota: cannot read {path}: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise UsageError(f"--quota: {path} is not valid JSON or YAML: {error}") from None
    try:
        tree = parse_config(data)
        check_jobs(cluster_tree(tree, total_gpus), ((job.job_id, job.queue, job.gpus) for job in jobs))
    except (QueueConfigError, QuotaTreeError) as error:
        raise UsageError(f"--quota: {error}") from None
    return tree


def default_forecaster() -> RuntimeForecaster:
    try:
        from kumiki.forecast.models import build_default_forecaster
    except ImportError as error:
        raise UsageError(
            f"--policy kumiki and forecast-backfill need kumiki.forecast.models ({error});"
            " use kumiki-oracle or kumiki-noforecast"
        ) from None
    return build_default_forecaster()


# ---- simulate -------------------------------------------------------------------------------------
def run_simulate(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kumiki.sched.cluster import uniform_cluster
    from kumiki.sim.engine import SimConfig, Simulator
    from kumiki.sim.report import (
        forecast_cost_table,
        idle_table,
        markdown_table,
        over_seeds,
        plot_results,
        seed_table,
        summarize,
        window_table,
        write_json,
    )
    from kumiki.sim.trace import TraceError, load_jobs, window
    from kumiki.sim.workload import WorkloadError, sim_jobs

    nodes = whole_number_option(args.nodes, "--nodes", 1)
    gpus_per_node = whole_number_option(args.gpus_per_node, "--gpus-per-node", 1)
    policies = names_option(args.policy, "--policy", tuple(POLICIES))
    placement = names_option(args.placement, "--placement", STRATEGIES)
    if len(placement) != 1:
        raise UsageError("--placement takes one strategy for simulate")
    seeds = seeds_option(args.seeds) if args.seeds is not None else [whole_number_option(args.seed, "--seed", 0)]
    seed = seeds[0]
    start_s = number_option(args.start_s, "--start-s", None)
    end_s = number_option(args.end_s, "--end-s", None)
    if start_s is not None and end_s is not None and end_s <= start_s:
        raise UsageError(f"--end-s ({end_s:g}) must be greater than --start-s ({start_s:g})")
    nodes_per_rack = whole_number_option(args.nodes_per_rack, "--nodes-per-rack", 1)
    interval = number_option(args.checkpoint_interval_s, "--checkpoint-interval-s")
    cost = number_option(args.checkpoint_cost_s, "--checkpoint-cost-s")
    restore = number_option(args.restore_cost_s, "--restore-cost-s")
    assert interval is not None and cost is not None and restore is not None
    if interval <= 0:
        raise UsageError("--checkpoint-interval-s must be > 0")
    checkpoint = CheckpointModel(interval, cost, restore)
    shares = load_queue_shares(args.queues) if args.queues else None
    reports = progress_reports_from(args)
    idle_share, idle = idle_from(args)
    shift = None
    try:
        full_trace = load_jobs(args.trace)
        if args.shift is not None:
            shift = shift_trace(full_trace, args.shift)
            full_trace = shift.jobs
    except TraceError as error:
        raise UsageError(f"--trace: {error}") from None
    except ShiftError as error:
        raise UsageError(f"--shift: {error}") from None
    day_order = None
    if args.day_order is not None:
        try:
            day_order = parse_day_order(args.day_order)
            full_trace = reorder_days(full_trace, day_order)
        except ShiftError as error:
            raise UsageError(f"--day-order: {error}") from None
    try:
        trace = window(full_trace, start_s, end_s)
        jobs_by_seed = {
            each: sim_jobs(trace, max_gpus=nodes * gpus_per_node, seed=each, idle_share=idle_share) for each in seeds
        }
    except (TraceError, WorkloadError) as error:
        raise UsageError(f"--trace: {error}") from None
    jobs = jobs_by_seed[seed]
    if not jobs:
        raise UsageError("--trace: no jobs in the chosen window")
    quota = None
    if args.quota is not None:
        quota = load_quota_tree(
            args.quota, [job for runs in jobs_by_seed.values() for job in runs], nodes * gpus_per_node
        )
    if shares is not None:
        unknown = sorted({job.queue for job in jobs} - set(shares))
        if unknown:
            raise UsageError(f"--queues: no guarantee for queue(s) {', '.join(unknown)} found in the trace")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    spec = uniform_cluster(nodes, gpus_per_node, nodes_per_rack=nodes_per_rack)
    if any(POLICIES[name].uses_forecast for name in policies):
        default_forecaster()  # a missing forecasting extra is a usage error before any run starts

    console = message_console()
    if shift is not None:
        console.print(f"synthetic shift {shift.describe()}")
    if reports is not None:
        console.print(reports.describe())
    results = []
    report: dict[str, Any] = {
        "policies": {},
        "config": {
            "trace": str(args.trace),
            "jobs": len(jobs),
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "placement": placement[0],
            "consolidated": True,
            "seed": seed,
            "seeds": seeds,
            "start_s": start_s,
            "end_s": end_s,
            "queues": shares,
            "quota": args.quota,
            "day_order": day_order,
            "shift": None
            if shift is None
            else {"name": shift.name, "queue": shift.queue, "from_s": shift.from_s, "jobs": len(shift.changed)},
            "checkpoint": {
                "interval_s": checkpoint.interval_s,
                "checkpoint_cost_s": checkpoint.checkpoint_cost_s,
                "restore_cost_s": checkpoint.restore_cost_s,
            },
            "progress_reports": None
            if reports is None
            else {"min_gpus": reports.min_gpus, "share": reports.share, "noise_sigma": reports.noise_sigma},
            "idle": None
            if not idle_share
            else {"fraction": idle_share, "found_after_s": idle.found_after_s, "reclaim": args.idle_reclaim},
        },
    }
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    with Progress(*columns, console=console, transient=False) as progress:
        for each in seeds:
            by_seed[each] = {}
            for name in policies:
                label = f"{name:>18}" + (f" seed {each}" if len(seeds) > 1 else "")
                task = progress.add_task(label, total=len(jobs_by_seed[each]))
                config = SimConfig(
                    POLICIES[name],
                    placement=placement[0],
                    checkpoint=checkpoint,
                    queue_shares=shares,
                    progress_reports=None if reports is None else replace(reports, seed=each),
                    quota=quota,
                    idle=idle,
                )
                started = time.perf_counter()
                simulator = Simulator(
                    spec,
                    jobs_by_seed[each],
                    config,
                    # a fresh forecaster per run: it learns online, and one run must not learn from another's
                    forecaster=default_forecaster() if POLICIES[name].uses_forecast else None,
                    progress=_advancer(progress, task),
                )
                result = simulator.run()
                summary = summarize(result, large_gpus=gpus_per_node)
                summary["wall_s"] = round(time.perf_counter() - started, 3)
                if result.quota is not None:
                    summary["quota"] = result.quota
                by_seed[each][name] = summary
                if each == seed:
                    report["policies"][name] = summary
                    results.append(result)
    report["seeds"] = over_seeds(by_seed)
    report["forecast_value"] = report["seeds"]["forecast_value"]
    sections_md = ""
    if args.day_windows:
        report["windows"] = _day_windows(
            full_trace,
            trace,
            policies,
            spec,
            placement[0],
            checkpoint,
            shares,
            gpus_per_node,
            seeds,
            reports,
            quota,
            (idle_share, idle),
        )
        report["windows_spread"] = _window_spread(report["windows"])
        sections_md = (
            f"\n## Day windows (avg JCT s; forecasters warmed on the days before)\n\n{window_table(report['windows'])}"
        )
    over = f", mean over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    for by, title, whose in (
        ("queue", "per queue", "each queue's jobs"),
        ("class", "per job class (own run time, GPUs)", "each class of jobs (by their own run time and size)"),
    ):
        cost_md = forecast_cost_table(report["seeds"][f"forecast_cost_by_{by}"], report.get("windows", {}), by=by)
        if cost_md:
            sections_md += (
                f"\n## What the forecasts added to the average JCT, {title} (s)\n\n"
                f"`kumiki` against `kumiki-noforecast` on {whose}, weighed by its share of the jobs{over}; "
                f"a column adds up to the gap of the two averages. Positive: the forecasts cost that {by} time.\n\n"
                f"{cost_md}"
            )
    write_json(out / "report.json", report)
    baseline = "fifo" if "fifo" in policies else None
    table = markdown_table(report["policies"], baseline)
    per_queue = _queue_table(report["policies"])
    if quota is not None:
        sections_md += f"\n## Quota admission (`--quota {args.quota}`)\n\n{_quota_table(report['policies'])}"
    idle_md = idle_table(report["policies"])
    if idle_md:
        sections_md += (
            f"\n## Idle GPUs ({idle_share:g} of the jobs are zombies; telemetry finds one after "
            f"{idle.found_after_s:g} s; `--idle-reclaim {args.idle_reclaim}`)\n\n{idle_md}"
        )
    value = report["forecast_value"]
    value_md = ""
    if len(seeds) > 1:
        table += f"\n## Average JCT over seeds {', '.join(map(str, seeds))} (s)\n\n{seed_table(report['seeds'])}"
    if value is not None:
        share = value["recovered_share"]
        over = f" (of the mean over {len(seeds)} seeds)" if len(seeds) > 1 else ""
        others = [
            f"`{name}`: {'n/a' if other is None else f'{100 * other:.1f}%'}"
            for name, other in report["seeds"]["recovered_share_by_policy"].items()
            if name != "kumiki"
        ]
        value_md = (
            f"\nShare of the oracle's gain over `kumiki-noforecast` that the forecasts recover{over}: "
            f"{'n/a (no gap)' if share is None else f'{100 * share:.1f}%'}"
            + (f" ({'; '.join(others)})" if others else "")
            + "\n"
        )
    (out / "report.md").write_text(
        f"# Simulation of {args.trace} on {nodes} x {gpus_per_node} GPUs ({placement[0]}, consolidated)\n\n"
        + (f"Synthetic shift {shift.describe()}.\n\n" if shift is not None else "")
        + (f"Days in the order {day_order} (`--day-order`).\n\n" if day_order is not None else "")
        + (f"{reports.describe()}.\n\n" if reports is not None else "")
        + (f"{idle_share:g} of the jobs are zombies (`--idle-fraction`).\n\n" if idle_share else "")
        + f"{table}{value_md}\n## Average JCT per queue (s)\n\n{per_queue}{sections_md}",
        encoding="utf-8",
    )
    if not args.no_plots:
        plot_results(results, out)
    console.print(table + value_md)
    if args.day_windows:
        console.print(window_table(report["windows"]))
    console.print(f"wrote {out / 'report.json'} and {out / 'report.md'}")
    return 0


def _day_windows(
    full_trace: Any,
    trace: Any,
    policies: list[str],
    spec: Any,
    placement: str,
    checkpoint: CheckpointModel,
    shares: dict[str, float] | None,
    gpus_per_node: int,
    seeds: list[int],
    reports: ProgressReports | None = None,
    quota: QuotaConfig | None = None,
    idle: tuple[float, IdleReclaim] | None = None,
) -> dict[str, Any]:
    """Each day of the (windowed) trace simulated on its own, once per seed (rows: the mean over seeds). A
    forecaster starts with what a live one would hold then: every job of the trace file that finished before
    the day began (`warm_up`)."""
    from kumiki.forecast.evaluate import warm_up
    from kumiki.sim.engine import SimConfig, Simulator
    from kumiki.sim.report import over_seeds, summarize
    from kumiki.sim.scenarios import IdleReclaim
    from kumiki.sim.trace import DAY_S, window
    from kumiki.sim.workload import sim_jobs

    idle_share, idle_reclaim = idle if idle is not None else (0.0, IdleReclaim())

    submits = [job.submit_s for job in trace if job.submit_s is not None]
    first_day, last_day = int(min(submits) // DAY_S), int(max(submits) // DAY_S)
    windows: dict[str, Any] = {}
    for day in range(first_day, last_day + 1):
        start, end = day * DAY_S, (day + 1) * DAY_S
        day_jobs = window(trace, start, end)
        count = len(sim_jobs(day_jobs, max_gpus=spec.total_gpus, seed=seeds[0]))
        if not count:
            continue
        by_seed: dict[int, dict[str, dict[str, Any]]] = {}
        warmed = None
        for seed in seeds:
            jobs = sim_jobs(day_jobs, max_gpus=spec.total_gpus, seed=seed, idle_share=idle_share)
            rows: dict[str, Any] = by_seed.setdefault(seed, {})
            for name in policies:
                forecaster = None
                if POLICIES[name].uses_forecast:
                    if warmed is None:
                        warmed = default_forecaster()
                        warm_up(warmed, full_trace, start)
                    forecaster = copy.deepcopy(warmed)  # each run learns on its own from the same history
                config = SimConfig(
                    POLICIES[name],
                    placement=placement,
                    checkpoint=checkpoint,
                    queue_shares=shares,
                    quota=quota,
                    progress_reports=None if reports is None else replace(reports, seed=seed),
                    idle=idle_reclaim,
                )
                result = Simulator(spec, jobs, config, forecaster=forecaster).run()
                summary = summarize(result, large_gpus=gpus_per_node)
                rows[name] = {
                    key: summary[key]
                    for key in ("jobs", "avg_jct_s", "p99_jct_s", "preemptions", "per_queue", "per_class")
                }
        entry: dict[str, Any] = {"start_s": start, "end_s": end, "jobs": count}
        spread = over_seeds(by_seed)
        entry.update(policies=spread["policies"], forecast_value=spread["forecast_value"])
        entry["recovered_share_by_seed"] = spread["recovered_share_by_seed"]
        entry["recovered_share_by_policy"] = spread["recovered_share_by_policy"]
        entry["forecast_cost_by_queue"] = spread["forecast_cost_by_queue"]
        entry["forecast_cost_by_class"] = spread["forecast_cost_by_class"]
        windows[f"day {day}"] = entry
    return windows


def _window_spread(windows: dict[str, Any]) -> dict[str, Any]:
    """The spread over windows, not one average: min / median / max of the recovered share and of kumiki's ratios."""
    import numpy as np

    def spread(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {
            "min": float(np.min(values)),
            "median": float(np.median(values)),
            "max": float(np.max(values)),
            "mean": float(np.mean(values)),
            "windows": len(values),
        }

    shares = [
        w["forecast_value"]["recovered_share"]
        for w in windows.values()
        if w.get("forecast_value") and w["forecast_value"]["recovered_share"] is not None
    ]
    out: dict[str, Any] = {"recovered_share": spread(shares)}
    for other in ("kumiki-noforecast", "tiresias", "srtf-oracle"):
        ratios = [
            w["policies"]["kumiki"]["avg_jct_s"] / w["policies"][other]["avg_jct_s"]
            for w in windows.values()
            if "kumiki" in w["policies"] and other in w["policies"]
        ]
        out[f"kumiki_over_{other}"] = spread(ratios)
    return out


def _advancer(progress: Any, task: Any) -> Callable[[int], None]:
    def advance(done: int) -> None:
        progress.advance(task, done)

    return advance


def _queue_table(policies: dict[str, Any]) -> str:
    queues = sorted({queue for row in policies.values() for queue in row["per_queue"]})
    lines = ["| queue | jobs | " + " | ".join(policies) + " |", "|" + "---|" * (len(policies) + 2)]
    for queue in queues:
        first = next(iter(policies.values()))["per_queue"].get(queue, {"jobs": 0})
        cells = [f"{row['per_queue'].get(queue, {}).get('avg_jct_s', 0):,.0f}" for row in policies.values()]
        lines.append(f"| {queue} | {first['jobs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _quota_table(policies: dict[str, Any]) -> str:
    """Per run: attempts quota held back (by the reason it first gave), reclaim victims, GPU-hours per queue."""
    queues = sorted({queue for row in policies.values() for queue in row["quota"]["gpu_s_by_queue"]})
    lines = [
        "| policy | held (by quota's reason) | reclaim victims | " + " | ".join(f"{q} GPU-h" for q in queues) + " |",
        "|" + "---|" * (len(queues) + 3),
    ]
    for name, row in policies.items():
        quota = row["quota"]
        held = ", ".join(f"{code} {count}" for code, count in quota["denied"].items()) or "none"
        hours = [f"{quota['gpu_s_by_queue'].get(queue, 0.0) / 3600:,.1f}" for queue in queues]
        lines.append(f"| {name} | {held} | {quota['reclaims']} | " + " | ".join(hours) + " |")
    return "\n".join(lines) + "\n"
