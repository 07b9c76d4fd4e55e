"""`python -m kumiki.telemetry` refuses a bad telemetry setting with one line naming it, before connecting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.parametrize(
    ("variable", "value", "beside"),
    [
        ("KUMIKI_TELEMETRY_IDLE", "research=abc:5", {}),
        ("KUMIKI_TELEMETRY_NODE_TIMEOUT_S", "soon", {}),
        ("KUMIKI_TELEMETRY_USAGE_STEP_S", "900", {}),
        ("KUMIKI_TELEMETRY_AGENT_AUDIENCE", "kumiki telemetry", {}),
        ("KUMIKI_TELEMETRY_AGENT_ACCOUNTS", "kumiki/kumiki-agent", {}),  # without an audience to review for
        ("KUMIKI_TELEMETRY_AGENT_ACCOUNTS", "kumiki-agent", {"KUMIKI_TELEMETRY_AGENT_AUDIENCE": "kumiki-telemetry"}),
        ("KUMIKI_TELEMETRY_AGENT_ACCOUNTS", "", {"KUMIKI_TELEMETRY_AGENT_AUDIENCE": "kumiki-telemetry"}),
        ("KUMIKI_TELEMETRY_AGENT_KEY_FILE", "/nonexistent/telemetry.key", {}),
        ("KUMIKI_TELEMETRY_AGENT_KEY_FILE", str(REPO_ROOT / "README.md") + "/no", {}),
        ("KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE", "/nonexistent/generations", {}),  # without a key
        (  # a key (any file of 32 bytes or more), generations that are not there
            "KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE",
            "/nonexistent/generations",
            {"KUMIKI_TELEMETRY_AGENT_KEY_FILE": str(REPO_ROOT / "pyproject.toml")},
        ),
        (  # generations that do not parse
            "KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE",
            str(REPO_ROOT / "README.md"),
            {"KUMIKI_TELEMETRY_AGENT_KEY_FILE": str(REPO_ROOT / "pyproject.toml")},
        ),
    ],
)
def test_bad_setting_exits_2_with_one_line(variable: str, value: str, beside: dict[str, str]) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "services"),
        **beside,
        variable: value,
        "KUMIKI_KAFKA_BOOTSTRAP": "127.0.0.1:1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "kumiki.telemetry"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kumiki-telemetry-ingest: configuration error: {variable}: ")
