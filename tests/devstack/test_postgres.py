from pathlib import Path

import pytest

from kumiki.devstack.postgres import stop_postgres


def test_stopping_where_no_server_runs_says_so_and_runs_nothing(tmp_path: Path) -> None:
    # no postmaster.pid: pg_ctl (which this bin_dir does not hold) is never run
    assert stop_postgres(tmp_path, tmp_path / "no-bin", None, mode="immediate") is False


def test_an_unknown_stop_mode_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "pgdata").mkdir()
    (tmp_path / "pgdata" / "postmaster.pid").write_text("1\n")
    with pytest.raises(ValueError, match="mode: 'abrupt'"):
        stop_postgres(tmp_path, tmp_path / "no-bin", None, mode="abrupt")
