"""The private stack's supervisor, on real processes: a killed service comes back on a new process, an exit
nobody asked for is restarted and counted, and a paused or busy service is left alone."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from kumiki.devstack.processes import StackError, alive
from kumiki.replay.private_stack import PrivateStack, wait_dead
from tests.conftest import REPO_ROOT


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateStack]:
    monkeypatch.setenv("PYTHONPATH", f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'services'}")
    monkeypatch.chdir(REPO_ROOT)
    private = PrivateStack(tmp_path, "system")
    private.state.broker = {"bootstrap": "127.0.0.1:9"}  # never dialled: the stand-ins read no environment
    private.state.database = {"url": "postgresql://kumiki@127.0.0.1:9/kumiki"}
    for index, name in enumerate(("quota", "forecast")):
        private.state.services[name] = {
            "module": "tests.replay.sleeping_service",
            "log": str(tmp_path / f"{name}.log"),
            "grpc_port": 1 + index,
            "http_port": 3 + index,
        }
        private.start(name)
    yield private
    for name in private.state.services:
        private.signal(name, signal.SIGKILL)


def _crash(stack: PrivateStack, name: str) -> int:
    pid = int(stack.state.services[name]["pid"])
    os.killpg(pid, signal.SIGKILL)
    wait_dead(pid)
    return pid


def test_kill_restarts_the_service_on_a_new_process_and_the_supervisor_counts_no_crash(
    stack: PrivateStack,
) -> None:
    before = stack.state.services["quota"]["pid"]

    stack.kill("quota")

    after = stack.state.services["quota"]["pid"]
    assert after != before and alive(after) and not alive(before)
    assert stack.supervise_once() == [] and stack.crashes == []
    saved = (stack.home / "stack.json").read_text()
    assert f'"pid": {after}' in saved  # `kumiki down` finds the new process


def test_the_supervisor_restarts_an_unasked_exit_once_and_leaves_paused_and_busy_services_alone(
    stack: PrivateStack,
) -> None:
    crashed = _crash(stack, "forecast")

    assert stack.supervise_once() == ["forecast"]
    assert [name for _, name in stack.crashes] == ["forecast"]
    assert stack.state.services["forecast"]["pid"] != crashed and alive(stack.state.services["forecast"]["pid"])
    assert stack.supervise_once() == []

    stack.paused.add("quota")
    stack.busy.add("forecast")
    _crash(stack, "quota")
    _crash(stack, "forecast")
    assert stack.supervise_once() == []
    stack.busy.clear()
    assert stack.supervise_once() == ["forecast"]
    assert len(stack.crashes) == 2


def test_wait_dead_gives_up_on_a_process_that_lives(stack: PrivateStack) -> None:
    with pytest.raises(StackError, match="still alive"):
        wait_dead(stack.state.services["quota"]["pid"], timeout_s=0.2)
