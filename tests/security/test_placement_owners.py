"""Placement checks that the caller may bind into the queue it names, with quota's identity and owner model
(quota.adapters.auth: bearer token or mTLS CN; an owner of a queue or of an ancestor): a wrong identity is
refused with PERMISSION_DENIED, a missing or unknown one with UNAUTHENTICATED, and each refusal is logged
with the identity, queue and job. Real placement service (the shared shell) on loopback, Apache Kafka."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import yaml

from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.service import ServiceHost
from kumiki.quota.adapters.auth import token_digest
from tests.conftest import wait_until
from tests.placement.support import bind_request, default_nodes, emulate, settings_for, whole

pytestmark = pytest.mark.kafka
TOKENS = {"alice": "alice-token-0123456789", "bob": "bob-token-0123456789", "binder": "binder-token-0123456789"}
QUEUES = {
    "cluster": {"gpus": {"A100": 16}},
    "queues": [
        {"name": "org", "owners": ["binder"]},  # the binder binds for every team: it owns the root
        {"name": "team-a", "parent": "org", "owners": ["alice"]},
        {"name": "team-b", "parent": "org", "owners": ["bob"]},
    ],
}


def bearer(who: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {TOKENS[who]}"),)


@pytest.fixture
async def placement(
    kafka: KafkaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ServiceHost, placement_pb2_grpc.PlacementStub]]:
    from kumiki.placement.app import SPEC

    (tmp_path / "queues.yaml").write_text(yaml.safe_dump(QUEUES))
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump({token_digest(t): who for who, t in TOKENS.items()}))
    monkeypatch.setenv("KUMIKI_PLACEMENT_QUEUES_FILE", str(tmp_path / "queues.yaml"))
    monkeypatch.setenv("KUMIKI_PLACEMENT_TOKENS_FILE", str(tmp_path / "tokens.yaml"))
    await emulate(kafka, default_nodes(2))
    host = ServiceHost(SPEC, settings_for(kafka))
    await host.start()
    try:
        book = host.runtime.components["book"]  # type: ignore[union-attr]
        await wait_until(lambda: len(book.nodes) == 2, what="the emulated nodes")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.grpc_port}") as channel:
            yield host, placement_pb2_grpc.PlacementStub(channel)
    finally:
        await host.stop()


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kumiki.placement.adapters.grpc" and r.msg == "request refused"]


async def test_an_owner_binds_and_a_wrong_identity_is_refused_and_logged(
    placement: tuple[ServiceHost, placement_pb2_grpc.PlacementStub], caplog: pytest.LogCaptureFixture
) -> None:
    _, stub = placement
    caplog.set_level(logging.WARNING)
    bound = await stub.Bind(bind_request("a-1", [whole(1)], queue="org/team-a"), metadata=bearer("alice"))
    assert bound.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
    by_root = await stub.Bind(bind_request("a-2", [whole(1)], queue="org/team-a"), metadata=bearer("binder"))
    assert by_root.outcome == placement_pb2.BindResponse.OUTCOME_BOUND  # an ancestor's owner may
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Bind(bind_request("b-1", [whole(1)], queue="org/team-a"), metadata=bearer("bob"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "queue org/team-a: 'bob' is not one of its owners"
    [line] = _refusals(caplog)
    assert (line.identity, line.queue, line.job, line.method) == ("bob", "org/team-a", "b-1", "Bind")  # type: ignore[attr-defined]
    explained = await stub.Explain(placement_pb2.ExplainRequest(job_id="b-1"), metadata=bearer("bob"))
    assert explained.status == "unknown"  # refused before anything was held or published


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ((), "no client certificate or bearer token"),
        ((("authorization", "Bearer not-a-known-token"),), "the bearer token is not known"),
        ((("authorization", "Basic YWxpY2U6eA=="),), "authorization: expected 'Bearer <token>'"),
    ],
)
async def test_a_caller_without_a_known_identity_is_unauthenticated(
    placement: tuple[ServiceHost, placement_pb2_grpc.PlacementStub],
    caplog: pytest.LogCaptureFixture,
    metadata: tuple[tuple[str, str], ...],
    reason: str,
) -> None:
    _, stub = placement
    caplog.set_level(logging.WARNING)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Bind(bind_request("x-1", [whole(1)], queue="org/team-a"), metadata=metadata)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == reason
    assert len(_refusals(caplog)) == 1


async def test_an_unknown_queue_is_refused_and_an_invalid_request_is_named_first(
    placement: tuple[ServiceHost, placement_pb2_grpc.PlacementStub],
) -> None:
    _, stub = placement
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Bind(bind_request("a-9", [whole(1)], queue="org/team-z"), metadata=bearer("alice"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "queue org/team-z: unknown queue (not in the queue file)"
    with pytest.raises(grpc.aio.AioRpcError) as invalid:
        await stub.Bind(bind_request("a-9", [], queue="org/team-a"), metadata=bearer("bob"))
    assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # what is wrong with the request comes first


async def test_only_an_owner_releases_a_job_and_bind_stream_checks_every_request(
    placement: tuple[ServiceHost, placement_pb2_grpc.PlacementStub], caplog: pytest.LogCaptureFixture
) -> None:
    host, stub = placement
    caplog.set_level(logging.WARNING)
    await stub.Bind(bind_request("a-3", [whole(2)], queue="org/team-a"), metadata=bearer("alice"))
    release = placement_pb2.ReleaseRequest(job=common_pb2.JobRef(job_id="a-3", generation=1), reason="done")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Release(release, metadata=bearer("bob"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    book = host.runtime.components["book"]  # type: ignore[union-attr]
    assert "a-3" in book.bound  # still held: bob's release changed nothing
    assert (await stub.Release(release, metadata=bearer("alice"))).released

    call = stub.BindStream(metadata=bearer("bob"))
    for request in (
        bind_request("b-2", [whole(1)], queue="org/team-b"),
        bind_request("b-3", [whole(1)], queue="org/team-a"),
    ):
        await call.write(request)
    await call.done_writing()
    answers = [answer async for answer in call]
    assert [a.status_code for a in answers] == [0, grpc.StatusCode.PERMISSION_DENIED.value[0]]
    assert answers[1].error == "queue org/team-a: 'bob' is not one of its owners"
    assert [(r.method, r.job) for r in _refusals(caplog)] == [("Release", "a-3"), ("Bind", "b-3")]  # type: ignore[attr-defined]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("service", "variable", "content", "expected"),
    [
        ("placement", "KUMIKI_PLACEMENT_QUEUES_FILE", "queues: [", "KUMIKI_PLACEMENT_QUEUES_FILE: "),
        ("quota", "KUMIKI_QUOTA_CONFIG_FILE", "queues: [", "KUMIKI_QUOTA_CONFIG_FILE: "),
        ("quota", "KUMIKI_QUOTA_CONFIG_FILE", "queues: [{name: a, colour: red}]", "KUMIKI_QUOTA_CONFIG_FILE: "),
    ],
)
def test_a_broken_queue_file_stops_the_service_with_one_line(
    kafka: KafkaSettings,
    postgres_admin_url: str,
    tmp_path: Path,
    service: str,
    variable: str,
    content: str,
    expected: str,
) -> None:
    """Found while fuzzing the queue file: a YAML error or an invalid queue at start was a traceback."""
    import os
    import subprocess
    import sys

    from kumiki.devstack.processes import free_port
    from tests.conftest import REPO_ROOT

    (tmp_path / "queues.yaml").write_text(content)
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump({token_digest(t): who for who, t in TOKENS.items()}))
    prefix = "KUMIKI_" + service.upper()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")},
        "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}",
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_DATABASE_URL": postgres_admin_url,
        f"{prefix}_GRPC_PORT": str(free_port()),
        f"{prefix}_HTTP_PORT": str(free_port()),
        variable: str(tmp_path / "queues.yaml"),
        f"{prefix}_TOKENS_FILE": str(tmp_path / "tokens.yaml"),
    }
    result = subprocess.run(
        [sys.executable, "-m", f"kumiki.{service}"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert line.startswith(f"kumiki-{service}: configuration error: {expected}"), line
