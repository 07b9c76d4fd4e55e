"""Reading traces: the schema's columns, and the pod features a trace may add (`image`, `command`, `time_limit_s`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kumiki.sim.trace import TRACE_COLUMNS, TraceError, load_jobs, write_jobs
from kumiki.sim.workload import featured_trace

HEADER = ",".join(TRACE_COLUMNS)


def write(tmp_path: Path, header: str, *rows: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text("\n".join((header, *rows)) + "\n", encoding="utf-8")
    return path


def test_a_trace_without_pod_features_reads_as_before(tmp_path: Path) -> None:
    (job,) = load_jobs(write(tmp_path, HEADER, "j1,10,1,,,300,alice,vc1,Pass,bert"))
    assert (job.user, job.queue, job.model, job.duration_s) == ("alice", "vc1", "bert", 300.0)
    assert (job.image, job.command, job.time_limit_s) == ("", "", None)


def test_pod_features_are_read_when_the_header_has_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        HEADER + ",image,command,time_limit_s",
        'j1,10,1,,,300,alice,vc1,Pass,bert,registry/bert:7,"python train.py --lr 3e-4",7200',
        "j2,11,1,,,300,alice,vc1,Pass,bert,,,",
    )
    first, second = load_jobs(path)
    assert (first.image, first.command, first.time_limit_s) == ("registry/bert:7", "python train.py --lr 3e-4", 7200.0)
    assert (second.image, second.command, second.time_limit_s) == ("", "", None), "empty cells: none known"


@pytest.mark.parametrize(
    ("value", "expected"), [("0", "must be > 0"), ("-5", "must be >= 0"), ("soon", "must be a number")]
)
def test_a_bad_time_limit_is_refused_naming_line_and_column(tmp_path: Path, value: str, expected: str) -> None:
    path = write(tmp_path, HEADER + ",time_limit_s", f"j1,10,1,,,300,alice,vc1,Pass,bert,{value}")
    with pytest.raises(TraceError, match=rf"trace.csv:2: column 'time_limit_s' {expected}"):
        load_jobs(path)


def test_written_jobs_read_back_as_they_were(tmp_path: Path) -> None:
    jobs = featured_trace(200, total_gpus=16, seed=2)
    write_jobs(tmp_path / "featured.csv", jobs)
    assert load_jobs(tmp_path / "featured.csv") == jobs


def test_written_whole_seconds_past_a_million_keep_every_digit(tmp_path: Path) -> None:
    """Whole-second submit times of a long trace (12+ days in) must not be rounded to six significant digits."""
    (job,) = load_jobs(write(tmp_path, HEADER, "j1,1071278,1,,,1234567,alice,vc1,Pass,bert"))
    write_jobs(tmp_path / "again.csv", [job])
    (again,) = load_jobs(tmp_path / "again.csv")
    assert (again.submit_s, again.duration_s) == (1071278.0, 1234567.0)
    assert again == job
