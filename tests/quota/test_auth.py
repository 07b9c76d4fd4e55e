"""Delegates (KUMIKI_QUOTA_DELEGATES): an identity that admits on behalf of callers it has checked itself
(placement under `kumiki up --tls`, whose certificate is not a queue owner) is admitted without the owner check;
every other identity still is checked. A real Quota server on loopback over the real Postgres."""

from __future__ import annotations

import grpc
import pytest

from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import quota_pb2_grpc
from kumiki.quota.adapters.auth import DELEGATES, Authenticator, QuotaSettings, token_digest
from kumiki.quota.adapters.grpc import QuotaServicer
from kumiki.quota.adapters.store import QuotaStore, write_config
from kumiki.quota.core import parse_config
from tests.quota.helpers import admit_request, migrated_pool, tree

TOKENS = {"placement": "token-of-placement-01", "mallory": "token-of-mallory-23"}


def test_delegates_are_read_from_the_environment() -> None:
    settings = QuotaSettings.from_env({"KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true", DELEGATES: " placement, binder ,"})
    assert settings.delegates == frozenset({"placement", "binder"})
    assert QuotaSettings.from_env({"KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true"}).delegates == frozenset()


@pytest.mark.postgres
async def test_a_delegate_is_admitted_without_owning_the_queue(database_settings: DatabaseSettings) -> None:
    pool = await migrated_pool(database_settings)
    await write_config(pool, parse_config(tree()), "test")
    settings = QuotaSettings(
        tokens={token_digest(token): who for who, token in TOKENS.items()}, delegates=frozenset({"placement"})
    )
    server = grpc.aio.server()
    quota_pb2_grpc.add_QuotaServicer_to_server(QuotaServicer(QuotaStore(pool), Authenticator(settings)), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = quota_pb2_grpc.QuotaStub(channel)
            reply = await stub.Admit(
                admit_request("delegated", "org/team-a", 2),
                metadata=(("authorization", f"Bearer {TOKENS['placement']}"),),
            )
            assert reply.admitted
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Admit(
                    admit_request("mallorys", "org/team-a", 2),
                    metadata=(("authorization", f"Bearer {TOKENS['mallory']}"),),
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert refused.value.details() == "queue org/team-a: 'mallory' is not one of its owners"
        rows = await pool.fetch("SELECT job_id FROM quota.holdings")
        assert [row["job_id"] for row in rows] == ["delegated"]
    finally:
        await server.stop(None)
        await pool.close()
