import os
import signal
import socket

from kumiki.devstack import processes
from kumiki.devstack.processes import LISTEN_PORTS_FROM, can_bind, ephemeral_ports, free_port


def test_free_ports_are_distinct_listenable_and_below_the_ephemeral_range():
    low, high = ephemeral_ports()
    assert 0 < low <= high
    ports = [free_port() for _ in range(100)]
    assert len(set(ports)) == len(ports)  # never the same port twice, even before any is bound
    assert all(LISTEN_PORTS_FROM <= port < low for port in ports)
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports[0]))
        server.listen()
        assert not can_bind(ports[0])  # taken now: a later free_port cannot return it
        assert ports[0] not in [free_port() for _ in range(50)]


def test_without_room_below_the_ephemeral_range_the_kernel_chooses(monkeypatch):
    low, high = ephemeral_ports()  # the kernel's own range, which bind(0) draws from
    monkeypatch.setattr(processes, "ephemeral_ports", lambda: (LISTEN_PORTS_FROM + 10, high))
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(low <= port <= high for port in ports)


def test_terminate_all_stops_every_group_at_once_and_kills_one_that_ignores_sigterm(tmp_path):
    log = tmp_path / "log"
    polite = processes.spawn(["sleep", "60"], log)
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    stubborn = processes.spawn(["bash", "-c", f"trap '' TERM; echo ok > {ready}; while true; do sleep 0.1; done"], log)
    with ready.open() as pipe:  # blocks until the trap is set: a SIGTERM before it would end bash, as CI once saw
        assert pipe.read() == "ok\n"
    gone = processes.spawn(["true"], log)
    while processes.alive(gone):  # exits at once; wait until it has (a pid known but no longer running)
        try:
            os.waitpid(gone, 0)
        except ChildProcessError:
            break
    outcomes = processes.terminate_all([polite, None, stubborn, gone], timeout_s=1.0)
    assert outcomes == [True, False, True, False]
    ended_by = {}
    for pid in (polite, stubborn):
        _, status = os.waitpid(pid, 0)  # reap both
        assert os.WIFSIGNALED(status) and not processes.alive(pid)
        ended_by[pid] = os.WTERMSIG(status)
    # the polite one ended on the SIGTERM, within the shared timeout; only the stubborn one needed SIGKILL
    assert ended_by == {polite: signal.SIGTERM, stubborn: signal.SIGKILL}
