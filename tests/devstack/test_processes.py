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
