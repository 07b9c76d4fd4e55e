"""Detached processes with pid files, and waiting for ports: the plumbing of the local stack."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class StackError(RuntimeError):
    """Something in the local stack could not start or stop; the message says what and where to look."""


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something listens on host:port. A connect to a loopback port in the ephemeral range with no
    listener can succeed by connecting to itself (TCP simultaneous open: the kernel picks that very port as the
    source), so a connection whose two ends are the same socket address is not a listener."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout) as connection:
        return bool(connection.getsockname() != connection.getpeername())
    return False


def can_bind(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now (a connect test misses a socket bound but not listening)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


# Ports handed out by this process, never handed out again by it (two calls before either port is bound must differ).
_HANDED_OUT: set[int] = set()
# Listening ports are chosen at or above this, below the kernel's ephemeral range (well-known services sit lower).
LISTEN_PORTS_FROM = 10_000


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux default 32768-60999)."""
    try:
        low, high = (int(value) for value in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A port free to listen on now, for a process that will bind it later.

    Chosen below the kernel's ephemeral range where there is room: a port the kernel hands out for bind(0) is an
    ephemeral one, which any outgoing connection may take as its source port before the process it was meant
    for binds it (CI saw a service fail with `address already in use` that way, on a machine busy with Kafka,
    Postgres, etcd and the API server's connections)."""
    low, _ = ephemeral_ports()
    if low - LISTEN_PORTS_FROM >= 1_000:
        chooser = random.SystemRandom()
        for _ in range(64):
            port = chooser.randrange(LISTEN_PORTS_FROM, low)
            if port not in _HANDED_OUT and can_bind(port, host):
                _HANDED_OUT.add(port)
                return port
    while True:
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):  # a zombie counts as gone
        return not _exited(Path(f"/proc/{pid}"))
    return True


def _stat_fields(path: Path) -> list[str]:
    """/proc/<pid>/stat after the command name: state, ppid, pgrp, ..."""
    return path.read_text().rpartition(")")[2].split()


def _exited(process: Path) -> bool:
    """Whether a /proc/<pid> is a zombie whose every thread has exited too (a leader thread can be one while
    other threads still run, and hold the process's sockets)."""
    if _stat_fields(process / "stat")[0] != "Z":
        return False
    with contextlib.suppress(OSError, IndexError):
        return all(_stat_fields(task / "stat")[0] == "Z" for task in (process / "task").iterdir())
    return True


# The processes this one started, kept so their exit status can be read (a dropped Popen is reaped by the next
# Popen anywhere in the process, and its status lost).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> int:
    """Start a process in its own session (it outlives this CLI), output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    _CHILDREN[process.pid] = process
    return process.pid


def exit_status(pid: int, wait_s: float = 0.0) -> int | None:
    """How a process this one spawned ended (negative: the signal that ended it), waiting up to wait_s; None
    while it runs, or when another process started it."""
    process = _CHILDREN.get(pid)
    if process is None:
        return None
    with contextlib.suppress(subprocess.TimeoutExpired):
        return process.wait(wait_s) if wait_s > 0 else process.poll()
    return None


def wait_for_port(host: str, port: int, timeout_s: float, pid: int | None, what: str, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if pid is not None and not alive(pid):
            raise StackError(f"{what} exited during start-up; see {log_path}")
        time.sleep(0.2)
    raise StackError(f"{what} did not open {host}:{port} within {timeout_s:.0f}s; see {log_path}")


def terminate(pid: int | None, timeout_s: float = 20.0) -> bool:
    """SIGTERM the process group, SIGKILL after the timeout; True when something was stopped."""
    return terminate_all([pid], timeout_s)[0]


def group_alive(pgid: int | None) -> bool:
    """Whether any process of the group still runs (zombies aside). The leader alone is not enough: a group's
    other processes, or the last threads of a leader already a zombie, can hold its ports."""
    if not pgid:
        return False
    if alive(pgid):
        return True
    for process in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(_stat_fields(process / "stat")[2]) == pgid and not _exited(process):
                return True
    return False


def terminate_all(pids: Sequence[int | None], timeout_s: float = 20.0, kill_wait_s: float = 10.0) -> list[bool]:
    """SIGTERM every process group at once, SIGKILL those still running after one shared timeout, and wait
    (kill_wait_s at most) until they are gone; for each pid, whether something was stopped. Stopping them
    together bounds `kumiki down` by one timeout, not one per service (on a loaded machine five graceful
    shutdowns in turn took minutes); waiting after SIGKILL means a port they held is free when this returns."""
    running = [pid for pid in pids if group_alive(pid)]
    for pid in running:
        assert pid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    left = _wait_gone(running, timeout_s)
    for pid in left:
        assert pid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    _wait_gone(left, kill_wait_s)
    return [pid in running for pid in pids]


def _wait_gone(pgids: Sequence[int | None], timeout_s: float) -> list[int | None]:
    """The groups still running after waiting up to timeout_s for all of them."""
    deadline = time.monotonic() + timeout_s
    left = list(pgids)
    while left:
        for pid in left:  # reap the ones this process spawned: a zombie child is gone, and its status is kept
            if pid is not None:
                exit_status(pid)
        left = [pid for pid in left if group_alive(pid)]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return left
