"""A token file that its owner replaces while the process runs (the kubelet rotating a projected token)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kumiki.common.token_file import TokenFile


def test_the_new_token_is_read_once_the_file_is_replaced_and_kept_while_it_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = TokenFile(path, "--token-file")
    assert token.refresh() == "first"
    replacement = tmp_path / "token.new"
    replacement.write_text("second")
    os.replace(replacement, path)  # as the kubelet swaps a projected volume's files
    assert token.refresh() == "second"
    path.write_text("")  # half written: the last good token stands
    assert token.refresh() == "second"
    path.unlink()  # gone for a moment: the same
    assert token.refresh() == "second"


def test_no_token_at_the_start_names_the_option(tmp_path: Path) -> None:
    class SetupError(ValueError):
        pass

    with pytest.raises(SetupError, match=r"^KUMIKI_JOB_TOKEN_FILE: cannot read '.*missing': No such file"):
        TokenFile(tmp_path / "missing", "KUMIKI_JOB_TOKEN_FILE", SetupError)
    (tmp_path / "empty").write_text("  \n")
    with pytest.raises(ValueError, match=r"^--token-file: '.*empty' is empty$"):
        TokenFile(tmp_path / "empty", "--token-file")


def test_a_recheck_interval_looks_at_the_file_at_most_that_often(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first")
    now = [100.0]
    token = TokenFile(path, "--token-file", recheck_s=1.0, clock=lambda: now[0])
    replacement = tmp_path / "token.new"
    replacement.write_text("second")
    os.replace(replacement, path)
    now[0] += 0.5
    assert token.refresh() == "first"  # looked at 0.5 s ago: not again yet
    now[0] += 0.5
    assert token.refresh() == "second"
