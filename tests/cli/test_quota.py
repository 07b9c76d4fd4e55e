"""`kumiki quota load` and `kumiki quota report` against the real Postgres."""

from __future__ import annotations

import asyncio
import csv
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from kumiki.cli.main import main
from kumiki.common.config import DatabaseSettings
from kumiki.quota.adapters.ledger import CLOSE_SQL, OPEN_SQL
from kumiki.quota.core import team_of
from tests.conftest import REPO_ROOT
from tests.quota.helpers import migrated_pool

EXAMPLE = REPO_ROOT / "docs" / "examples" / "queues.yaml"
HOUR_US = 3_600_000_000
T0_US = 1_798_761_600 * 1_000_000  # 2027-01-01T00:00:00Z


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The CLI runs its own event loop: async tests call this in a thread."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_check_validates_without_a_database(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["quota", "load", "--check", "--file", str(EXAMPLE)], capsys)
    assert code == 0 and "7 queues valid" in err and "vision" in out


def test_bad_file_names_the_queue_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["queues"].append({"name": "ghost", "parent": "acme/nowhere", "guarantee": 1})
    bad = tmp_path / "queues.yaml"
    bad.write_text(yaml.safe_dump(data))
    code, _, err = run(["quota", "load", "--check", "--file", str(bad)], capsys)
    assert code == 2
    assert err.strip() == (
        f"kumiki quota: error: --file: {bad}: queue acme/nowhere/ghost: parent: unknown parent queue 'acme/nowhere'"
    )
    code, _, err = run(["quota", "report", "--since", "yesterday", "--until", "2027-01-02"], capsys)
    assert code == 2 and "--since" in err


@pytest.mark.postgres
async def test_load_is_all_or_nothing_and_report_sums_the_ledger(
    database_settings: DatabaseSettings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = ["--database-url", database_settings.url]
    pool = await migrated_pool(database_settings)
    try:
        code, _, err = await asyncio.to_thread(run, ["quota", "load", "--file", str(EXAMPLE), *url], capsys)
        assert code == 0 and "applied as version 1" in err
        data = yaml.safe_load(EXAMPLE.read_text())
        data["queues"][-1]["guarantee"] = -3  # acme/batch
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(data))
        code, _, err = await asyncio.to_thread(run, ["quota", "load", "--file", str(bad), *url], capsys)
        assert code == 2 and "queue acme/batch: guarantee: must be a finite number >= 0" in err
        assert await pool.fetchval("SELECT version FROM quota.config_version") == 1
        assert await pool.fetchval("SELECT count(*) FROM quota.queues") == 7

        # (job, queue, model, gpus, start hour, end hour): one job crosses the window's start
        jobs = [
            ("j1", "acme/research/vision", "A100-80GB", "2", -1, 3),
            ("j2", "acme/research/language", "H100-80GB", "0.5", 0, 10),
            ("j3", "acme/product/search", "A100-80GB", "4", 2, 4),
            ("j4", "acme/batch", "H100-80GB", "1", 30, 40),  # outside the window
        ]
        async with pool.acquire() as connection:
            for job, queue, model, gpus, start, end in jobs:
                await connection.execute(
                    OPEN_SQL, job, 1, queue, model, 0, Decimal(gpus), 0.0, 0.0, T0_US + start * HOUR_US
                )
                await connection.execute(CLOSE_SQL, job, 1, T0_US + end * HOUR_US, 8, f"evt-{job}")
        rates = {"A100-80GB": Decimal("1.80"), "H100-80GB": Decimal("3.20")}
        window = ["--since", "2027-01-01T00:00", "--until", "2027-01-02"]
        expected: dict[str, dict[str, Decimal]] = {"team": {}, "queue": {}, "model": {}}
        expected_cost: dict[str, Decimal] = {}
        for _job, queue, model, gpus, start, end in jobs:
            seconds = Decimal(gpus) * max(0, min(end, 24) - max(start, 0)) * 3600
            if seconds == 0:
                continue
            for by, key in (("team", team_of(queue)), ("queue", queue), ("model", model)):
                expected[by][key] = expected[by].get(key, Decimal(0)) + seconds
            expected_cost[team_of(queue)] = (
                expected_cost.get(team_of(queue), Decimal(0)) + seconds / 3600 * rates[model]
            )
        for by in ("team", "queue", "model"):
            out_csv = tmp_path / f"report-{by}.csv"
            argv = ["quota", "report", *window, "--by", by, "--csv", str(out_csv), *url]
            code, out, err = await asyncio.to_thread(run, argv, capsys)
            assert code == 0, err
            rows = list(csv.DictReader(out_csv.open()))
            assert {row[by]: Decimal(row["gpu_seconds"]) for row in rows} == expected[by]
            assert out_csv.with_suffix(".png").stat().st_size > 0
            assert "total" in out
            if by == "team":
                assert {row["team"]: Decimal(row["cost"]) for row in rows} == {
                    team: cost.quantize(Decimal("0.01")) for team, cost in expected_cost.items()
                }
    finally:
        await pool.close()


def test_messages_stay_on_one_line_whatever_the_terminal_width(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A long path once wrapped a message at 80 columns, so scripts (and a test) matching it failed."""
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    copy = deep / "queues.yaml"
    copy.write_text(EXAMPLE.read_text())
    code, _, err = run(["quota", "load", "--check", "--file", str(copy)], capsys)
    assert code == 0
    assert f"{copy}: 7 queues valid" in err.splitlines()[0]
