"""`kumiki checkpoints job-token`: the token the Checkpoints service takes from that job alone; bad input named.
(That the service takes the printed token, and refuses it for another job: tests/preemption/test_identity.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from kumiki.cli import checkpoints
from kumiki.cli.main import main
from kumiki.preemption.adapters.identity import KEY_FILE, job_token

KEY = b"0123456789abcdef" * 3


def test_a_jobs_token_is_the_one_the_service_checks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "jobs.key"
    key_file.write_bytes(KEY + b"\n")  # a trailing newline, as `openssl rand -hex 32 > file` writes
    assert main(["checkpoints", "job-token", "--key-file", str(key_file), "--job", "team-a/llama"]) == 0
    assert capsys.readouterr().out == job_token(KEY, "team-a/llama") + "\n"
    monkeypatch.setenv(KEY_FILE, str(key_file))  # the service's own variable is the default
    assert main(["checkpoints", "job-token", "--job", "team-a/llama", "--job", "team-b/bert"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"team-a/llama\t{job_token(KEY, 'team-a/llama')}", f"team-b/bert\t{job_token(KEY, 'team-b/bert')}"]
    assert checkpoints.KEY_VARIABLE == KEY_FILE


@pytest.mark.parametrize(
    ("key", "job", "message"),
    [
        (None, "team-a/llama", "--key-file: required (or set KUMIKI_CHECKPOINTS_JOB_KEY_FILE)"),
        (b"short", "team-a/llama", "has 5 bytes; at least 32"),
        (KEY, " team-a/llama", "--job: ' team-a/llama' is empty or has surrounding whitespace"),
        (KEY, "", "--job: '' is empty"),
    ],
)
def test_bad_input_exits_2_naming_the_option(
    key: bytes | None,
    job: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_FILE, raising=False)
    argv = ["checkpoints", "job-token", "--job", job]
    if key is not None:
        (tmp_path / "key").write_bytes(key)
        argv += ["--key-file", str(tmp_path / "key")]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
    assert capsys.readouterr().out == ""
