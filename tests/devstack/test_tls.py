"""`kumiki up --tls` for real: a development CA and certificates, every gRPC service serving mTLS only, the CLI
finding its certificate in the stack state (a bind goes CLI -> placement -> quota, each hop mTLS), and every
service refusing a client without a certificate, with one from another CA, or in plaintext."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import SERVICES
from kumiki.devstack.tls import DevelopmentCA
from tests.devstack.test_stack import kumiki, stack_home  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def _health(address: str, credentials: grpc.ChannelCredentials | None) -> int:
    channel = grpc.aio.secure_channel(address, credentials) if credentials else grpc.aio.insecure_channel(address)
    async with channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(reply.status)


async def test_up_tls_serves_only_clients_with_a_certificate(stack_home: Path, tmp_path: Path) -> None:  # noqa: F811
    ports = ["--kafka-port", str(free_port()), "--postgres-port", str(free_port())]
    up = kumiki(stack_home, "up", "--tls", "--no-replay", *ports, timeout=420)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    state = json.loads((stack_home / "stack.json").read_text())
    assert state["tls"]["client"] == "kumiki-cli"
    ca = DevelopmentCA.load(Path(state["tls"]["folder"]))

    # the CLI's bind: its certificate from the stack state to placement, placement's own to quota
    bind = kumiki(stack_home, "placement", "bind", "tls-1", "--queue", "research", "--gpus", "8")
    assert bind.returncode == 0 and '"OUTCOME_BOUND"' in bind.stdout, bind.stdout + bind.stderr
    released = kumiki(stack_home, "placement", "release", "tls-1", "--outcome", "completed")
    assert released.returncode == 0 and '"released": true' in released.stdout, released.stdout + released.stderr

    stranger = DevelopmentCA.create(tmp_path / "other", common_name="Someone else's CA").issue("kumiki-cli")
    refused_clients = {
        "plaintext": None,
        "no certificate": ca.channel_credentials(),
        "certificate from another CA": grpc.ssl_channel_credentials(
            root_certificates=ca.cafile.read_bytes(),
            private_key=stranger.keyfile.read_bytes(),
            certificate_chain=stranger.certfile.read_bytes(),
        ),
    }
    assert set(state["services"]) == set(SERVICES)
    for name, info in state["services"].items():
        address = f"127.0.0.1:{info['grpc_port']}"
        assert await _health(address, ca.channel_credentials("kumiki-cli")) == health_pb2.HealthCheckResponse.SERVING  # type: ignore[arg-type]
        for client, credentials in refused_clients.items():
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await _health(address, credentials)  # type: ignore[arg-type]
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, f"{name} answered a client with {client}"

    # the next `up` after `down` is plaintext again unless --tls
    down = kumiki(stack_home, "down")
    assert down.returncode == 0
    assert json.loads((stack_home / "stack.json").read_text())["tls"] is None
