"""The CLI's entry point: how it ends when its reader goes away."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT

# a command that prints far more than a pipe holds, through the real entry point
PRINTS_A_LOT = textwrap.dedent(
    """
    import argparse, sys
    from kumiki.cli import main as cli

    def build_parser():
        parser = argparse.ArgumentParser(prog="kumiki")
        parser.set_defaults(command="flood", handler=lambda args: [print("row", n) for n in range(1_000_000)])
        return parser

    cli.build_parser = build_parser
    sys.exit(cli.main([]))
    """
)


def test_a_reader_that_leaves_early_ends_the_command_quietly_with_sigpipes_status() -> None:
    reader = subprocess.Popen(
        [sys.executable, "-c", PRINTS_A_LOT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT / "services")},
    )
    assert reader.stdout is not None and reader.stderr is not None
    assert reader.stdout.readline() == b"row 0\n"
    reader.stdout.close()  # as `| head -1` does
    errors = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 141
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors
