"""mTLS between gRPC services, for real: a service started by the shared shell with KUMIKI_TLS_CERTFILE,
KUMIKI_TLS_KEYFILE and KUMIKI_TLS_CLIENT_CAFILE (certificates from kumiki.devstack.tls, as `kumiki up --tls`
makes them) answers a client holding a certificate from its CA, and refuses one without a certificate, one with
a certificate from another CA, and a plaintext one. Quota takes the certificate's common name as the identity
it checks against queue owners."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kumiki.common.config import DatabaseSettings, KafkaSettings, ServerSettings, Settings
from kumiki.common.contracts.v1 import common_pb2, placement_pb2, placement_pb2_grpc, quota_pb2, quota_pb2_grpc
from kumiki.common.service import ServiceHost
from kumiki.devstack.tls import DevelopmentCA, service_tls_env

pytestmark = pytest.mark.kafka


def _settings(
    service: str, kafka: KafkaSettings, ca: DevelopmentCA, database: DatabaseSettings | None = None
) -> Settings:
    env = service_tls_env(ca, service)
    return Settings(
        service=service,
        kafka=kafka,
        database=database or DatabaseSettings(),
        server=ServerSettings(
            host="127.0.0.1",
            tls_certfile=Path(env["KUMIKI_TLS_CERTFILE"]),
            tls_keyfile=Path(env["KUMIKI_TLS_KEYFILE"]),
            tls_client_cafile=Path(env["KUMIKI_TLS_CLIENT_CAFILE"]),
        ),
        instance=f"{service}-mtls-{uuid.uuid4().hex[:6]}",
    )


@pytest.fixture
async def placement_over_mtls(kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[tuple[ServiceHost, DevelopmentCA]]:
    from kumiki.placement.app import SPEC

    ca = DevelopmentCA.create(tmp_path / "ca")
    host = ServiceHost(SPEC, _settings("placement", kafka, ca))
    await host.start()
    try:
        yield host, ca
    finally:
        await host.stop()


async def _explain(address: str, credentials: grpc.ChannelCredentials | None) -> placement_pb2.ExplainResponse:
    channel = grpc.aio.secure_channel(address, credentials) if credentials else grpc.aio.insecure_channel(address)
    async with channel:
        stub = placement_pb2_grpc.PlacementStub(channel)
        return await stub.Explain(placement_pb2.ExplainRequest(job_id="nobody"), timeout=5)


async def test_a_client_with_a_certificate_from_the_ca_is_served(
    placement_over_mtls: tuple[ServiceHost, DevelopmentCA],
) -> None:
    host, ca = placement_over_mtls
    address = f"127.0.0.1:{host.grpc_port}"
    answer = await _explain(address, ca.channel_credentials("kumiki-binder"))  # type: ignore[arg-type]
    assert answer.status  # 'unknown' for a job it never saw: an answer, over mTLS
    async with grpc.aio.secure_channel(address, ca.channel_credentials("kumiki-cli")) as channel:  # type: ignore[arg-type]
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("client", ["no certificate", "certificate from another CA", "plaintext"])
async def test_a_client_without_a_certificate_from_the_ca_is_refused(
    placement_over_mtls: tuple[ServiceHost, DevelopmentCA], client: str, tmp_path: Path
) -> None:
    host, ca = placement_over_mtls
    credentials: grpc.ChannelCredentials | None
    if client == "no certificate":
        credentials = ca.channel_credentials()  # type: ignore[assignment]  # trusts the server, presents nothing
    elif client == "certificate from another CA":
        other = DevelopmentCA.create(tmp_path / "other", common_name="Someone else's CA")
        stranger = other.issue("kumiki-binder")  # the same name, the wrong issuer
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca.cafile.read_bytes(),
            private_key=stranger.keyfile.read_bytes(),
            certificate_chain=stranger.certfile.read_bytes(),
        )
    else:
        credentials = None
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _explain(f"127.0.0.1:{host.grpc_port}", credentials)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake fails: no call reaches a handler


@pytest.mark.postgres
async def test_quota_over_mtls_takes_the_certificates_common_name_as_the_identity(
    kafka: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice (the CN of her certificate) owns team-a; bob's certificate, from the same CA, does not."""
    from kumiki.quota.app import SPEC

    ca = DevelopmentCA.create(tmp_path / "ca")
    queues = {
        "cluster": {"gpus": {"A100": 8}},
        "queues": [{"name": "team-a", "guarantee": 4, "owners": ["alice"]}, {"name": "team-b", "owners": ["bob"]}],
    }
    (tmp_path / "queues.yaml").write_text(yaml.safe_dump(queues))
    monkeypatch.setenv("KUMIKI_QUOTA_CONFIG_FILE", str(tmp_path / "queues.yaml"))
    monkeypatch.setenv("KUMIKI_TLS_CLIENT_CAFILE", str(ca.cafile))  # what makes quota take identities from mTLS
    monkeypatch.delenv("KUMIKI_QUOTA_ALLOW_ANONYMOUS", raising=False)
    host = ServiceHost(SPEC, _settings("quota", kafka, ca, database_settings))
    await host.start()
    try:
        request = quota_pb2.AdmitRequest(job=common_pb2.JobRef(job_id="j1", generation=1), queue="team-a", gpus=1)
        address = f"127.0.0.1:{host.grpc_port}"
        async with grpc.aio.secure_channel(address, ca.channel_credentials("alice")) as channel:  # type: ignore[arg-type]
            admitted = await quota_pb2_grpc.QuotaStub(channel).Admit(request, timeout=10)
        assert admitted.admitted
        async with grpc.aio.secure_channel(address, ca.channel_credentials("bob")) as channel:  # type: ignore[arg-type]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await quota_pb2_grpc.QuotaStub(channel).Admit(request, timeout=10)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "'bob' is not one of its owners" in (refused.value.details() or "")
    finally:
        await host.stop()


async def test_client_channel_calls_a_service_over_mtls_with_the_variables_tls_sets(
    placement_over_mtls: tuple[ServiceHost, DevelopmentCA],
) -> None:
    """kumiki.common.grpcutil.client_channel: what every Kumiki client should open (KUMIKI_GRPC_* from
    kumiki.devstack.tls.client_tls_env); without the variables it is plaintext, and refused here."""
    from kumiki.common.grpcutil import client_channel
    from kumiki.devstack.tls import client_tls_env

    host, ca = placement_over_mtls
    address = f"127.0.0.1:{host.grpc_port}"
    async with client_channel(address, client_tls_env(ca, "kumiki-cli")) as channel:
        answer = await placement_pb2_grpc.PlacementStub(channel).Explain(placement_pb2.ExplainRequest(job_id="j"))
    assert answer.status
    async with client_channel(address, {}) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await placement_pb2_grpc.PlacementStub(channel).Explain(placement_pb2.ExplainRequest(job_id="j"), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
