"""Reading job traces in the traces' schema (kumiki/data/traces/README.md).

A trace is named by a path or by the name of a bundled trace (`philly-slice`, see `kumiki.data`).

Every row is validated; a bad row raises `TraceError` naming the file, line and column, so a
typo in a hand-made trace never turns into a silently different experiment.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kumiki.data import bundled_trace

TRACE_COLUMNS = ("job_id", "submit_s", "gpus", "cpus", "mem_gb", "duration_s", "user", "queue", "status", "model")
# What pods carry and the public traces do not: read when the header has them (the forecaster keys on them)
OPTIONAL_TRACE_COLUMNS = ("image", "command", "time_limit_s")
DAY_S = 86_400.0  # the days traces are cut into (day windows, rolling-origin days, reordered weeks)
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


class TraceError(ValueError):
    """A trace file that does not follow the schema; the message names file, line and column."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace. `duration_s` is the truth: only the simulator clock and oracles may read it."""

    job_id: str
    submit_s: float | None
    gpus: float
    cpus: float | None
    mem_gb: float | None
    duration_s: float | None
    user: str
    queue: str
    status: str
    model: str
    image: str = ""
    command: str = ""
    time_limit_s: float | None = None  # the run time the job asked for; None: none asked


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One node of a node file (openb schema): capacity only."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


def _number(raw: str, *, where: str, column: str, required: bool, minimum: float = 0.0) -> float | None:
    text = raw.strip()
    if not text:
        if required:
            raise TraceError(f"{where}: column '{column}' is empty but required")
        return None
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: column '{column}' must be a number, got {text!r}") from None
    if math.isnan(value) or math.isinf(value):
        raise TraceError(f"{where}: column '{column}' must be finite, got {text!r}")
    if value < minimum:
        raise TraceError(f"{where}: column '{column}' must be >= {minimum:g}, got {text!r}")
    return value


def _located(path: Path) -> Path:
    """The file itself, else the bundled trace of that name; a missing file keeps its own name in the error."""
    if path.is_file() or path.suffix not in ("", ".csv") or len(path.parts) != 1:
        return path
    try:
        return bundled_trace(path.name)
    except FileNotFoundError:
        return path


def _rows(path: Path, expected: tuple[str, ...]) -> Iterator[tuple[str, dict[str, str]]]:
    path = _located(path)
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as error:
        raise TraceError(f"{path}: cannot open trace file: {error.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:  # bytes that are not UTF-8 are a bad file, not a crash (found by tests/fuzz)
            header = tuple(reader.fieldnames or ())
            missing = [column for column in expected if column not in header]
            if missing:
                raise TraceError(f"{path}: header lacks column(s) {', '.join(missing)}; expected {', '.join(expected)}")
            for row in reader:
                where = f"{path}:{reader.line_num}"
                if None in row:
                    raise TraceError(f"{where}: more fields than the header has columns")
                yield where, {key: (value or "") for key, value in row.items()}
        except UnicodeDecodeError as error:
            raise TraceError(
                f"{path}:{reader.line_num + 1}: not UTF-8 (byte {error.object[error.start]:#04x})"
            ) from None


def parse_job(where: str, row: dict[str, str]) -> TraceJob:
    """Validate one row of the job schema."""
    job_id = row["job_id"].strip()
    if not job_id:
        raise TraceError(f"{where}: column 'job_id' is empty but required")
    gpus = _number(row["gpus"], where=where, column="gpus", required=True)
    assert gpus is not None
    time_limit_s = _number(row.get("time_limit_s", ""), where=where, column="time_limit_s", required=False)
    if time_limit_s is not None and time_limit_s <= 0:
        raise TraceError(f"{where}: column 'time_limit_s' must be > 0 when given, got {row['time_limit_s']!r}")
    return TraceJob(
        job_id=job_id,
        submit_s=_number(row["submit_s"], where=where, column="submit_s", required=False),
        gpus=gpus,
        cpus=_number(row["cpus"], where=where, column="cpus", required=False),
        mem_gb=_number(row["mem_gb"], where=where, column="mem_gb", required=False),
        duration_s=_number(row["duration_s"], where=where, column="duration_s", required=False),
        user=row["user"].strip(),
        queue=row["queue"].strip(),
        status=row["status"].strip(),
        model=row["model"].strip(),
        image=row.get("image", "").strip(),
        command=row.get("command", "").strip(),
        time_limit_s=time_limit_s,
    )


def load_jobs(path: str | Path) -> list[TraceJob]:
    """All jobs of a trace file, in file order; duplicate job ids are an error."""
    trace_path = Path(path)
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    for where, row in _rows(trace_path, TRACE_COLUMNS):
        job = parse_job(where, row)
        if job.job_id in seen:
            raise TraceError(f"{where}: column 'job_id' repeats {job.job_id!r}")
        seen.add(job.job_id)
        jobs.append(job)
    return jobs


def write_jobs(path: str | Path, jobs: Iterable[TraceJob]) -> None:
    """Write jobs in the trace schema (`load_jobs` reads them back as they were), with the pod-feature columns."""

    def cell(value: float | None) -> str:
        # whole numbers as integers ("1071278", not `:g`'s six digits "1.07128e+06"), the rest exactly (repr)
        return "" if value is None else str(int(value)) if value == int(value) else repr(value)

    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow((*TRACE_COLUMNS, *OPTIONAL_TRACE_COLUMNS))
        for job in jobs:
            writer.writerow(
                (
                    job.job_id,
                    cell(job.submit_s),
                    cell(job.gpus),
                    cell(job.cpus),
                    cell(job.mem_gb),
                    cell(job.duration_s),
                    job.user,
                    job.queue,
                    job.status,
                    job.model,
                    job.image,
                    job.command,
                    cell(job.time_limit_s),
                )
            )


def load_nodes(path: str | Path) -> list[TraceNode]:
    """All nodes of a node file (openb-nodes.csv schema)."""
    nodes: list[TraceNode] = []
    for where, row in _rows(Path(path), NODE_COLUMNS):
        name = row["sn"].strip()
        if not name:
            raise TraceError(f"{where}: column 'sn' is empty but required")
        cpu = _number(row["cpu_milli"], where=where, column="cpu_milli", required=True)
        memory = _number(row["memory_mib"], where=where, column="memory_mib", required=True)
        gpus = _number(row["gpu"], where=where, column="gpu", required=True)
        assert cpu is not None and memory is not None and gpus is not None
        if gpus != int(gpus):
            raise TraceError(f"{where}: column 'gpu' must be a whole number, got {row['gpu']!r}")
        nodes.append(TraceNode(name, int(cpu), int(memory), int(gpus), row["model"].strip()))
    return nodes


def window(jobs: Iterable[TraceJob], start_s: float | None, end_s: float | None) -> list[TraceJob]:
    """Jobs submitted in [start_s, end_s); jobs without a submit time are kept only when no window is set."""
    if start_s is None and end_s is None:
        return list(jobs)
    low = -math.inf if start_s is None else start_s
    high = math.inf if end_s is None else end_s
    return [job for job in jobs if job.submit_s is not None and low <= job.submit_s < high]
