"""`kumiki telemetry node-key`: the key telemetry derives for a node, printed for its agent; bad input named."""

from __future__ import annotations

from pathlib import Path

import pytest

from kumiki.cli.main import main
from kumiki.telemetry.core import node_key

KEY = b"c0ffee" * 8


def test_a_nodes_key_is_the_one_telemetry_derives_and_only_that_node_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "telemetry.key"
    key_file.write_bytes(KEY + b"\n")
    assert main(["telemetry", "node-key", "--key-file", str(key_file), "--node", "gpu-1"]) == 0
    assert capsys.readouterr().out == node_key(KEY, "gpu-1").decode() + "\n"
    assert main(["telemetry", "node-key", "--key-file", str(key_file), "--node", "gpu-1", "--node", "gpu-2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"gpu-1\t{node_key(KEY, 'gpu-1').decode()}", f"gpu-2\t{node_key(KEY, 'gpu-2').decode()}"]
    assert node_key(KEY, "gpu-1") != node_key(KEY, "gpu-2")


@pytest.mark.parametrize(
    ("key", "node", "message"),
    [
        (None, "gpu-1", "--key-file: required (or set KUMIKI_TELEMETRY_AGENT_KEY_FILE)"),
        (b"short", "gpu-1", "has 5 bytes; at least 32"),
        (KEY, "Bad_Node", "--node: 'Bad_Node' is not a lowercase DNS-1123 name"),
    ],
)
def test_bad_input_exits_2_naming_the_option(
    key: bytes | None,
    node: str,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUMIKI_TELEMETRY_AGENT_KEY_FILE", raising=False)
    argv = ["telemetry", "node-key", "--node", node]
    if key is not None:
        (tmp_path / "key").write_bytes(key)
        argv += ["--key-file", str(tmp_path / "key")]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_withdrawn_nodes_key_is_printed_at_its_generation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "telemetry.key"
    key_file.write_bytes(KEY)
    generations = tmp_path / "generations"
    generations.write_text("gpu-1 3\n")
    monkeypatch.setenv("KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE", str(generations))  # as telemetry reads it
    argv = ["telemetry", "node-key", "--key-file", str(key_file)]
    assert main([*argv, "--node", "gpu-1", "--node", "gpu-2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"gpu-1\t{node_key(KEY, 'gpu-1', 3).decode()}",
        f"gpu-2\t{node_key(KEY, 'gpu-2').decode()}",  # not listed: unchanged
    ]
    assert main([*argv, "--node", "gpu-1", "--generation", "4"]) == 0
    assert capsys.readouterr().out == node_key(KEY, "gpu-1", 4).decode() + "\n"
    generations.write_text("gpu-1 three\n")
    for extra, message in (
        ([], "--generations-file: line 1: generation of 'gpu-1' must be a whole number"),
        (["--generations-file", str(tmp_path / "missing")], "--generations-file: cannot read"),
        (["--generation", "-1"], "--generation: must be in [0, 1000000], got -1"),
    ):
        if extra and extra[0] == "--generation":
            generations.write_text("")
        with pytest.raises(SystemExit) as exited:
            main([*argv, "--node", "gpu-1", *extra])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
