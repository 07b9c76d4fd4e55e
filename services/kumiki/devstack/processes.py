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
    with contextlib.suppress(OSError):  # a zombie child counts as gone
        status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return status != "Z"
    return True


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
    return process.pid


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


def terminate_all(pids: Sequence[int | None], timeout_s: float = 20.0) -> list[bool]:
    """SIGTERM every process group at once, SIGKILL those still running after one shared timeout; for each pid,
    whether something was stopped. Stopping them together bounds `kumiki down` by one timeout, not one per
    service (on a loaded machine five graceful shutdowns in turn took minutes)."""
    running = [pid for pid in pids if alive(pid)]
    for pid in running:
        assert pid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    left = list(running)
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if alive(pid)]
        if left:
            time.sleep(0.1)
    for pid in left:
        assert pid is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return [pid in running for pid in pids]
