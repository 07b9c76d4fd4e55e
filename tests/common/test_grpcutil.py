"""The request guard's reasons: which field of an undecodable request is wrong, from the wire format alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import grpc
import pytest
from google.protobuf.message import DecodeError

from kumiki.common.config import ConfigError, DatabaseSettings
from kumiki.common.contracts.v1 import common_pb2, placement_pb2
from kumiki.common.grpcutil import (
    LogBudget,
    RequestGuard,
    Undecodable,
    channel_credentials,
    client_credentials,
    guarded_deserializer,
    undecodable_reason,
)
from tests.conftest import wait_until

BIND = placement_pb2.BindRequest.DESCRIPTOR


def _valid() -> bytes:
    return placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="j", generation=1), queue="q", pods=[common_pb2.PodResources(gpus=1)]
    ).SerializeToString()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x0a\x05ab", "job: length 5 runs past the end of the message (byte 0)"),
        (b"\x12\x02\xff\xfe", "queue: not valid UTF-8"),
        (b"\x0a\x03\x0a\x01\xff", "job.job_id: not valid UTF-8"),
        (b"\x1a\x00\x1a\x02\x08", "pods[1]: length 2 runs past the end of the message (byte 2)"),
        (b"\x1a\x02\x08\x80", "pods[0].gpus: truncated at byte 2"),
        (b"\x1a\x01\x0d", "pods[0].gpus: truncated fixed-width value at byte 0"),
        (b"\x08", "job: truncated at byte 1"),
        (b"\xff\xff\xff", "request: a field tag: truncated at byte 3"),
        (b"\x00", "request: field number 0 at byte 0"),
        (b"\x0b", "job: group encoding (wire type 3) is not used by any Kumiki message"),
        (b"\x0f", "job: invalid wire type 7 at byte 0"),
    ],
)
def test_the_reason_names_the_field_that_does_not_decode(data: bytes, reason: str) -> None:
    """Byte offsets count from the start of the enclosing message (pods[0]'s own bytes for pods[0].gpus)."""
    with pytest.raises(DecodeError):
        placement_pb2.BindRequest.FromString(data)
    assert undecodable_reason(BIND, data) == f"request: undecodable as kumiki.v1.BindRequest: {reason}"


def test_a_guarded_deserializer_returns_the_message_or_undecodable_never_raises() -> None:
    deserialize = guarded_deserializer(placement_pb2.BindRequest.FromString)
    assert deserialize(_valid()).queue == "q"
    rejected = deserialize(_valid()[:-1])
    assert isinstance(rejected, Undecodable)
    assert rejected.reason.startswith("request: undecodable as kumiki.v1.BindRequest: pods[0]")


def test_the_log_budget_allows_a_burst_then_counts_what_it_leaves_out() -> None:
    budget = LogBudget(rate=0.0001, burst=3)
    assert [budget.take() for _ in range(3)] == [0, 0, 0]
    assert budget.take() is None and budget.take() is None
    budget.tokens = 1.0
    assert budget.take() == 2  # the next line says two were left out


async def test_the_guard_rejects_on_a_real_server_with_invalid_argument() -> None:
    """A minimal server with only the guard (no Kumiki service): the generic path, unary and streaming."""

    async def echo(request: placement_pb2.BindRequest, context: grpc.aio.ServicerContext) -> bytes:
        return request.SerializeToString()

    async def count(requests, context):  # type: ignore[no-untyped-def]
        total = 0
        async for _ in requests:
            total += 1
        return bytes([total])

    handlers = grpc.method_handlers_generic_handler(
        "t.T",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo, placement_pb2.BindRequest.FromString, lambda b: b),
            "Count": grpc.stream_unary_rpc_method_handler(count, placement_pb2.BindRequest.FromString, lambda b: b),
        },
    )
    server = grpc.aio.server(interceptors=[RequestGuard("test")])
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await channel.unary_unary("/t.T/Echo")(_valid()) == _valid()
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await channel.unary_unary("/t.T/Echo")(b"\x12\x02\xff\xfe")
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == "request: undecodable as kumiki.v1.BindRequest: queue: not valid UTF-8"
            assert await channel.stream_unary("/t.T/Count")(iter([_valid(), _valid()])) == b"\x02"
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await channel.stream_unary("/t.T/Count")(iter([_valid(), b"\x0a\x05ab"]))
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(None)
        await asyncio.sleep(0)


def test_a_nul_in_any_string_is_refused_naming_the_field() -> None:
    """Postgres text cannot hold U+0000: without this every service storing a name answered UNKNOWN."""
    deserialize = guarded_deserializer(placement_pb2.BindRequest.FromString)
    request = placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="j", generation=1),
        queue="q",
        pods=[common_pb2.PodResources(gpu_fraction=0.5), common_pb2.PodResources(gpu_model="A\x00")],
    )
    rejected = deserialize(request.SerializeToString())
    assert isinstance(rejected, Undecodable)
    assert rejected.reason == "pods[1].gpu_model: contains a NUL character (U+0000), which no Kumiki name may hold"
    del request.pods[1]  # a zero byte in a double is not a NUL in a string
    assert isinstance(deserialize(request.SerializeToString()), placement_pb2.BindRequest)
    # in a map's key the map is named: a key is no field path
    request.pods.add(gpus=1, node_preference={"n\x00.x; y": 5})
    rejected = deserialize(request.SerializeToString())
    assert isinstance(rejected, Undecodable)
    assert rejected.reason.startswith("pods[1].node_preference: contains a NUL character")


async def test_a_handler_that_loses_its_database_answers_unavailable(database_settings: DatabaseSettings) -> None:
    """A session the database ends mid-call (a fast shutdown or pg_terminate_backend, as a Postgres restart
    does) is UNAVAILABLE, which callers retry, not UNKNOWN with the exception's text."""
    connection = await asyncpg.connect(database_settings.url)
    pid = connection.get_server_pid()

    async def slow(request: placement_pb2.BindRequest, context: grpc.aio.ServicerContext) -> bytes:
        await connection.fetchval("SELECT pg_sleep(30)")
        return b""

    handlers = grpc.method_handlers_generic_handler(
        "t.T", {"Slow": grpc.unary_unary_rpc_method_handler(slow, placement_pb2.BindRequest.FromString, lambda b: b)}
    )
    server = grpc.aio.server(interceptors=[RequestGuard("test")])
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    admin = await asyncpg.connect(database_settings.url)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = asyncio.ensure_future(channel.unary_unary("/t.T/Slow")(_valid(), timeout=20))

            async def sleeping() -> bool:
                query = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND query LIKE 'SELECT pg_sleep%'"
                return bool(await admin.fetchval(query, pid))

            await wait_until(sleeping, what="the handler's query to be running")
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            assert raised.value.details() == "the database is unavailable; retry"
    finally:
        await admin.close()
        await connection.close()
        await server.stop(None)


def test_channel_credentials_name_the_service_s_variables_and_need_a_key_with_a_certificate(tmp_path: Path) -> None:
    for name in ("ca.crt", "me.crt", "me.key"):
        (tmp_path / name).write_text("not parsed until a handshake")
    ca, cert, key = (str(tmp_path / name) for name in ("ca.crt", "me.crt", "me.key"))

    assert channel_credentials({}, "KUMIKI_QUOTA") is None  # plaintext
    assert isinstance(channel_credentials({"KUMIKI_QUOTA_CAFILE": ca}, "KUMIKI_QUOTA"), grpc.ChannelCredentials)
    mutual = {"KUMIKI_PLACEMENT_CERTFILE": cert, "KUMIKI_PLACEMENT_KEYFILE": key}
    assert channel_credentials(mutual, "KUMIKI_PLACEMENT") is not None  # the system's roots, our identity
    with pytest.raises(ConfigError, match="KUMIKI_PLACEMENT_KEYFILE: KUMIKI_PLACEMENT_CERTFILE and"):
        channel_credentials({"KUMIKI_PLACEMENT_CERTFILE": cert}, "KUMIKI_PLACEMENT")
    with pytest.raises(ConfigError, match="KUMIKI_QUOTA_CAFILE: expected a readable file"):
        channel_credentials({"KUMIKI_QUOTA_CAFILE": str(tmp_path / "missing.crt")}, "KUMIKI_QUOTA")


def test_calls_between_kumiki_services_need_the_ca_that_signed_them() -> None:
    assert client_credentials({"KUMIKI_QUOTA_CAFILE": "/elsewhere"}) is None  # only KUMIKI_GRPC_* count here
    with pytest.raises(ConfigError, match="KUMIKI_GRPC_CAFILE: required with KUMIKI_GRPC_CERTFILE"):
        client_credentials({"KUMIKI_GRPC_CERTFILE": __file__, "KUMIKI_GRPC_KEYFILE": __file__})
