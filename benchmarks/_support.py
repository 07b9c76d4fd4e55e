"""Shared by the benchmark scripts: a broker to run against, the traces, and latency summaries."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer

from kumiki.data import TRACES_DIR
from kumiki.devstack.broker import start_noida
from kumiki.devstack.processes import free_port, terminate

Result = TypeVar("Result")

TRACES = TRACES_DIR  # the traces the package ships (kumiki.data)
PHILLY = TRACES / "philly-slice.csv"


def trace_jobs(description: str) -> list[Any]:
    """`--trace` (default: the Philly slice) parsed from the command line and loaded, validated."""
    from kumiki.sim.trace import load_jobs

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--trace", default=str(PHILLY), help="job trace: a CSV path or a bundled name (kumiki.data)")
    return list(load_jobs(parser.parse_args().trace))


def whole_numbers_or_exit(text: str, option: str, minimum: int, parser: argparse.ArgumentParser) -> list[int]:
    """A comma-separated list of whole numbers >= `minimum`, or the parser's usage error naming `option`."""
    from kumiki.common.config import ConfigError, whole_numbers

    try:
        return whole_numbers(text, option, minimum=minimum)
    except ConfigError as error:
        parser.error(str(error))


def out_and_trace_or_exit(out_text: str, trace_text: str, parser: argparse.ArgumentParser) -> tuple[Path, list[Any]]:
    """`--out` (a folder, or nothing yet) and `--trace` loaded and validated, or the parser's usage error."""
    from kumiki.sim.trace import TraceError, load_jobs

    out = Path(out_text)
    if out.exists() and not out.is_dir():
        parser.error(f"--out: {out} exists and is not a folder")
    try:
        trace = list(load_jobs(trace_text))
    except (TraceError, OSError) as error:
        parser.error(f"--trace: {error}")
    if not trace:
        parser.error("--trace: the trace has no jobs")
    return out, trace


class RecordingForecaster:
    """Passes everything to a forecaster (one that also hears starts and stops, as the default one does) and
    keeps the p50 it issued for each job: the first (what the job was judged by when it was queued) and the last.
    Measurement only."""

    def __init__(self, forecaster: Any) -> None:
        self.forecaster = forecaster
        self.first_p50_s: dict[str, float] = {}
        self.last_p50_s: dict[str, float] = {}

    def predict(self, job: Any) -> Any:
        forecast = self.forecaster.predict(job)
        self.first_p50_s.setdefault(job.job_id, forecast.p50_s)
        self.last_p50_s[job.job_id] = forecast.p50_s
        return forecast

    def observe(self, job: Any, runtime_s: float, finished_s: float) -> None:
        self.forecaster.observe(job, runtime_s, finished_s)

    def started(self, job_id: str, start_s: float) -> None:
        self.forecaster.started(job_id, start_s)

    def stopped(self, job_id: str, stop_s: float) -> None:
        self.forecaster.stopped(job_id, stop_s)


async def publish_from_callers(producer: Any, spec: Any, items: Sequence[tuple[str, Any]], callers: int) -> float:
    """`callers` concurrent callers each publishing one event at a time and waiting for its acknowledgement
    (how a service answering requests publishes); returns the seconds it took."""
    queue = list(items)

    async def caller() -> None:
        while queue:
            key, message = queue.pop()
            await producer.publish(spec, key, message)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(callers)))
    return time.perf_counter() - started


@contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    """The given broker, or a development broker (noida-db) started in a temporary folder for the run."""
    if bootstrap:
        yield bootstrap
        return
    folder = Path(tempfile.mkdtemp(prefix="kumiki-bench-"))
    started = start_noida(folder / "data", free_port(), folder / "noida.log")
    try:
        yield started.bootstrap
    finally:
        terminate(started.pid)


def percentile(values: Sequence[float], level: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(level / 100 * (len(ordered) - 1))))
    return ordered[index]


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used so far; Linux /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_consumer(bootstrap: str, topic: str, **options: Any) -> AIOKafkaConsumer:
    """A plain aiokafka consumer in a fresh group from the earliest offset: the baseline Kumiki's consumers
    are compared with."""
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:6]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **options,
    )


def simulation_grid(
    parser: argparse.ArgumentParser, *, default_out: str, default_nodes: str = "48,64"
) -> tuple[argparse.Namespace, list[int], list[int], int, Path, list[Any]]:
    """The options every seeds-by-sizes simulation benchmark takes (--nodes, --seeds, --workers, --trace, --out),
    parsed and validated: each size must hold the trace's largest job, and --out is created. Returns (all the
    arguments, sizes, seeds, workers, out, trace jobs), or exits with the parser's usage error naming the option."""
    from kumiki.sim.workload import WorkloadError, sim_jobs

    parser.add_argument("--nodes", default=default_nodes, help="cluster sizes (nodes of 8 GPUs), comma-separated")
    parser.add_argument("--seeds", default="0,1,2", help="orderings of same-second submits, comma-separated")
    parser.add_argument("--workers", default=str(os.cpu_count() or 1), help="processes sharing the runs")
    parser.add_argument("--trace", default=str(PHILLY), help="job trace: a CSV path or a bundled name (kumiki.data)")
    parser.add_argument("--out", default=default_out, help="folder for report.json and the plot")
    args = parser.parse_args()
    sizes = whole_numbers_or_exit(args.nodes, "--nodes", 1, parser)
    seeds = whole_numbers_or_exit(args.seeds, "--seeds", 0, parser)
    workers = whole_numbers_or_exit(args.workers, "--workers", 1, parser)[0]
    out, trace = out_and_trace_or_exit(args.out, args.trace, parser)
    for nodes in sizes:
        try:
            sim_jobs(trace, max_gpus=nodes * 8, seed=seeds[0])
        except WorkloadError as error:
            parser.error(f"--nodes {nodes} / --trace: {error}")
    create_out_or_exit(out, parser)
    return args, sizes, seeds, workers, out, trace


def create_out_or_exit(out: Path, parser: argparse.ArgumentParser) -> None:
    """Create --out (and its parents), or exit with the parser's usage error saying why not."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--out: cannot create {out}: {error.strerror}")


def plot_rows_by_seed(
    report: dict[str, Any], path: Path, title: str, gpus_per_node: int, highlight: str | None = None
) -> None:
    """One panel per cluster size of `report["sizes"]`: each row's mean average JCT as a bar, its seeds as dots
    (rows whose name starts with `highlight` in green)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = report["sizes"]
    figure, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for axis, (nodes, summary) in zip(axes[0], sizes.items(), strict=True):
        names = list(summary["rows"])
        for index, name in enumerate(names):
            values = list(summary["rows"][name]["avg_jct_s"].values())
            axis.scatter([index] * len(values), values, color="tab:gray", s=12, zorder=2)
            colour = "tab:green" if highlight is not None and name.startswith(highlight) else "tab:blue"
            axis.bar(index, summary["rows"][name]["mean_s"], color=colour, alpha=0.6, zorder=1)
        axis.set_xticks(range(len(names)), [textwrap.fill(name, 16) for name in names], fontsize=7)
        low = min(min(row["avg_jct_s"].values()) for row in summary["rows"].values())
        axis.set_ylim(low * 0.97, None)
        axis.set_ylabel("average JCT (s); dots: seeds")
        axis.set_title(f"{nodes} x {gpus_per_node} GPUs")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_sizes_report(
    out: Path,
    report: dict[str, Any],
    plot: Callable[[dict[str, Any], Path], None],
    png: str,
    markdown: Callable[[int, Any], str],
) -> None:
    """Write report.json and the plot `png` into `out`, then print one markdown table per cluster size of
    `report["sizes"]` and the wall time."""
    from kumiki.sim.report import write_json

    write_json(out / "report.json", report)
    plot(report, out / png)
    for nodes, summary in report["sizes"].items():
        print(markdown(int(nodes), summary) + "\n")
    print(f"wall {report['wall_s']:,.0f} s; wrote {out / 'report.json'} and {out / png}")


def same_key_windows(jobs: Sequence[Any], window_s: float) -> Iterator[tuple[list[Any], list[tuple[int, int]]]]:
    """Per (queue, GPUs) key: its jobs in submit order (ties in the order given), and for each of them the slice
    [low, high) of those jobs submitted within +-`window_s` of it, the job itself included."""
    import bisect
    from collections import defaultdict

    by_key: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for job in jobs:
        by_key[(job.queue, job.gpus)].append(job)
    for members in by_key.values():
        members.sort(key=lambda job: job.submit_s)
        submits = [job.submit_s for job in members]
        low = [bisect.bisect_left(submits, submit - window_s) for submit in submits]
        high = [bisect.bisect_right(submits, submit + window_s) for submit in submits]
        windows = list(zip(low, high, strict=True))
        yield members, windows


def run_in_processes(
    function: Callable[..., Result],
    plan: Sequence[tuple[Any, ...]],
    workers: int,
    describe: Callable[[tuple[Any, ...]], str],
) -> Iterator[tuple[tuple[Any, ...], Result]]:
    """`function(*arguments)` for every entry of `plan` on `workers` processes, with a progress bar (on stderr)
    that names the last one done; yields (arguments, result) as each finishes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        Progress(*columns, console=Console(stderr=True)) as progress,
        ProcessPoolExecutor(max_workers=workers) as pool,
    ):
        overall = progress.add_task(f"simulations on {workers} worker(s)", total=len(plan))
        pending: dict[Future[Result], tuple[Any, ...]] = {
            pool.submit(function, *arguments): arguments for arguments in plan
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                arguments = pending.pop(future)
                result = future.result()
                progress.update(overall, description=f"last: {describe(arguments)}")
                progress.advance(overall)
                yield arguments, result


def best_us(run: Callable[[], object], count: int, repeat: int) -> float:
    """Microseconds per call of `run`: `count` calls timed together, the best of `repeat` such runs."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(count):
            run()
        best = min(best, time.perf_counter() - started)
    return best / count * 1e6


def at_least_one_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace, *options: str) -> None:
    """Exit 2 naming the first of `options` (whole-number arguments) below 1."""
    for option in options:
        if getattr(args, option) < 1:
            parser.error(f"--{option}: must be at least 1, got {getattr(args, option)}")


def ratio_table(title: str, headers: tuple[str, str, str], values: dict[str, float], baseline: str, form: str) -> Any:
    """A rich table of one number per row (`form`, a format spec) and its ratio to the `baseline` row's."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column(headers[0])
    for header in headers[1:]:
        table.add_column(header, justify="right")
    for name, value in values.items():
        table.add_row(name, format(value, form), f"{value / values[baseline]:.2f}x")
    return table
