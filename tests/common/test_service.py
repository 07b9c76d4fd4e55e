"""A service told to listen on a port another socket holds: exit EXIT_PORT_IN_USE with one line naming the
variable, before it touches the broker or the database (so whoever started it can move it, as `kumiki up`
does)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from kumiki.common.config import EXIT_PORT_IN_USE
from kumiki.devstack.processes import free_port


@pytest.mark.parametrize("kind", ["GRPC", "HTTP"])
def test_a_taken_port_exits_with_its_own_status_and_names_the_variable(kind: str) -> None:
    ports = {"GRPC": free_port(), "HTTP": free_port()}
    nobody = free_port()  # no broker and no database listen here: reaching either would end otherwise
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", ports[kind]))
        holder.listen()
        result = subprocess.run(
            [sys.executable, "-m", "kumiki.quota"],
            capture_output=True,
            text=True,
            timeout=120,
            env={
                "PATH": "/usr/bin:/bin",
                "GRPC_VERBOSITY": "NONE",
                "KUMIKI_QUOTA_GRPC_PORT": str(ports["GRPC"]),
                "KUMIKI_QUOTA_HTTP_PORT": str(ports["HTTP"]),
                "KUMIKI_KAFKA_BOOTSTRAP": f"127.0.0.1:{nobody}",
                "KUMIKI_DATABASE_URL": f"postgresql://kumiki@127.0.0.1:{nobody}/kumiki",
                "KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true",
            },
        )
    assert result.returncode == EXIT_PORT_IN_USE, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"kumiki-quota: KUMIKI_QUOTA_{kind}_PORT: cannot listen on 127.0.0.1:{ports[kind]}: ")
