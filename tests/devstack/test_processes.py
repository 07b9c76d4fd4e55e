import os
import signal
import socket
import sys

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
    assert processes.exit_status(gone, wait_s=30) == 0  # a pid known but no longer running
    outcomes = processes.terminate_all([polite, None, stubborn, gone], timeout_s=1.0)
    assert outcomes == [True, False, True, False]
    # the polite one ended on the SIGTERM, within the shared timeout; only the stubborn one needed SIGKILL, and
    # both are gone (reaped, their status kept) when terminate_all returns
    ended_by = {pid: processes.exit_status(pid) for pid in (polite, stubborn)}
    assert ended_by == {polite: -signal.SIGTERM, stubborn: -signal.SIGKILL}
    assert not processes.alive(polite) and not processes.alive(stubborn)


def test_terminate_all_stops_a_group_whose_leader_has_exited_and_frees_the_port_it_held(tmp_path):
    """A process left in the group after its leader exited (here a listener started in the background) still
    holds its port: terminate_all stops the group, not the leader alone, and returns once the port is free."""
    port = free_port()
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    listener = (
        f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen();"
        f" open({str(ready)!r}, 'w').write('ok'); time.sleep(300)"
    )
    leader = processes.spawn(["bash", "-c", f'{sys.executable} -c "{listener}" & exit 0'], tmp_path / "log")
    with ready.open() as pipe:  # the listener is up; its leader exits at once
        assert pipe.read() == "ok"
    assert processes.exit_status(leader, wait_s=30) == 0
    assert not processes.alive(leader) and processes.group_alive(leader)
    assert not can_bind(port)
    assert processes.terminate_all([leader], timeout_s=10.0) == [True]
    assert not processes.group_alive(leader)
    assert can_bind(port)
