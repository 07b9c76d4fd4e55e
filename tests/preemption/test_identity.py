"""Checkpoints takes a job's reports only from that job: its per-job token (HMAC of the job id under the
service's key) or an mTLS certificate named job:<id>, over a real gRPC server with the real Postgres registry.
Another job's token or certificate is PERMISSION_DENIED, none at all UNAUTHENTICATED, each refusal logged once
at WARNING, and nothing refused reaches the registry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from kumiki.cli.main import main as cli_main
from kumiki.common.config import ConfigError, DatabaseSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, common_pb2
from kumiki.common.db import apply_migrations, create_pool
from kumiki.devstack.tls import DevelopmentCA
from kumiki.preemption.adapters.grpc import CheckpointsServicer
from kumiki.preemption.adapters.identity import KEY_FILE, JobIdentity, job_token
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.sdk.checkpoint import Job, SdkConfigError

pytestmark = pytest.mark.postgres
KEY = b"k" * 32


@dataclass
class Served:
    plain: str  # host:port without TLS (tokens)
    secure: str  # host:port with mTLS (certificates)
    ca: DevelopmentCA
    registry: CheckpointRegistry


@pytest.fixture
async def served(database_settings: DatabaseSettings, tmp_path: Path) -> AsyncIterator[Served]:
    pool = await create_pool(database_settings)
    await apply_migrations(pool, "preemption", "kumiki.preemption.migrations")
    registry = CheckpointRegistry(pool)
    ca = DevelopmentCA.create(tmp_path / "ca")
    files = ca.issue("preemption")
    server = grpc.aio.server()
    servicer = CheckpointsServicer(registry, identity=JobIdentity(KEY))
    checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(servicer, server)
    plain = server.add_insecure_port("127.0.0.1:0")
    credentials = grpc.ssl_server_credentials(
        [(files.keyfile.read_bytes(), files.certfile.read_bytes())],
        root_certificates=ca.cafile.read_bytes(),
        require_client_auth=True,
    )
    secure = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        yield Served(f"127.0.0.1:{plain}", f"127.0.0.1:{secure}", ca, registry)
    finally:
        await server.stop(None)
        await pool.close()


def report(job_id: str, step: int = 100) -> checkpoints_pb2.CheckpointReport:
    message = checkpoints_pb2.CheckpointReport(
        job=common_pb2.JobRef(job_id=job_id, generation=1), uri=f"s3://ckpt/{job_id}/{step}", step=step
    )
    message.completed_at.seconds = 1_700_000_000 + step
    return message


async def _report(address: str, message: checkpoints_pb2.CheckpointReport, token: str | None) -> None:
    metadata = (("authorization", f"Bearer {token}"),) if token is not None else None
    async with grpc.aio.insecure_channel(address) as channel:
        await checkpoints_pb2_grpc.CheckpointsStub(channel).Report(message, timeout=10, metadata=metadata)


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "checkpoints call refused"]


async def test_a_job_reports_with_its_own_token(served: Served) -> None:
    await _report(served.plain, report("team/a"), job_token(KEY, "team/a"))
    latest = await served.registry.latest("team/a")
    assert latest is not None and latest.uri == "s3://ckpt/team/a/100"


async def test_the_token_kumiki_checkpoints_job_token_prints_is_taken_for_its_job_alone(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "jobs.key"
    key_file.write_bytes(KEY)
    assert cli_main(["checkpoints", "job-token", "--key-file", str(key_file), "--job", "team/cli"]) == 0
    printed = capsys.readouterr().out.strip()
    await _report(served.plain, report("team/cli"), printed)
    assert await served.registry.latest("team/cli") is not None
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _report(served.plain, report("team/other"), printed)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_another_jobs_token_is_permission_denied_and_logged_once(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kumiki.preemption.adapters.identity")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _report(served.plain, report("team/a"), job_token(KEY, "team/b"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == "job team/a: the token is not this job's"
    assert await served.registry.latest("team/a") is None  # nothing refused was recorded
    [line] = _refusals(caplog)
    assert line.levelno == logging.WARNING
    assert (line.job, line.code, line.method) == ("team/a", "PERMISSION_DENIED", "Report")  # type: ignore[attr-defined]
    # a token made with another key (a guess) is refused the same way
    with pytest.raises(grpc.aio.AioRpcError) as guessed:
        await _report(served.plain, report("team/a"), job_token(b"x" * 32, "team/a"))
    assert guessed.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert len(_refusals(caplog)) == 2


async def test_no_credential_is_unauthenticated(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kumiki.preemption.adapters.identity")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _report(served.plain, report("team/a"), None)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as malformed:
        await _report(served.plain, report("team/a"), "")
    assert malformed.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert len(_refusals(caplog)) == 2


async def test_resume_point_and_watch_are_the_jobs_own_too(served: Served) -> None:
    await _report(served.plain, report("team/a"), job_token(KEY, "team/a"))
    request = checkpoints_pb2.ResumePointRequest(job=common_pb2.JobRef(job_id="team/a", generation=2))
    async with grpc.aio.insecure_channel(served.plain) as channel:
        stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
        own = await stub.ResumePoint(request, metadata=(("authorization", f"Bearer {job_token(KEY, 'team/a')}"),))
        assert own.found and own.uri == "s3://ckpt/team/a/100"
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ResumePoint(request, metadata=(("authorization", f"Bearer {job_token(KEY, 'team/b')}"),))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        watch = stub.Watch(
            checkpoints_pb2.WatchRequest(job=request.job),
            metadata=(("authorization", f"Bearer {job_token(KEY, 'team/b')}"),),
        )
        with pytest.raises(grpc.aio.AioRpcError) as watched:
            await watch.read()
        assert watched.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_certificate_names_the_job_it_may_report_for(served: Served) -> None:
    async def with_certificate(name: str, job_id: str) -> None:
        credentials = served.ca.channel_credentials(name)
        async with grpc.aio.secure_channel(served.secure, credentials) as channel:  # type: ignore[arg-type]
            await checkpoints_pb2_grpc.CheckpointsStub(channel).Report(report(job_id), timeout=10)

    await with_certificate("job:team-c", "team-c")
    assert await served.registry.latest("team-c") is not None
    for stranger in ("job:team-d", "kumiki-cli"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await with_certificate(stranger, "team-e")
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert f"certificate {stranger!r} is not job:team-e" in (refused.value.details() or "")
    assert await served.registry.latest("team-e") is None


def test_the_key_is_configured_from_a_file_of_at_least_32_bytes(tmp_path: Path) -> None:
    assert JobIdentity.from_env({}) is None  # off unless configured
    key = tmp_path / "job.key"
    key.write_bytes(b"short")
    with pytest.raises(ConfigError, match=f"^{KEY_FILE}: .* has 5 bytes; at least 32"):
        JobIdentity.from_env({KEY_FILE: str(key)})
    with pytest.raises(ConfigError, match=f"^{KEY_FILE}: expected a readable file"):
        JobIdentity.from_env({KEY_FILE: str(tmp_path / "missing")})
    key.write_bytes(KEY + b"\n")
    identity = JobIdentity.from_env({KEY_FILE: str(key)})
    assert identity is not None and identity.key == KEY


def _sdk_round_trip(env: dict[str, str]) -> str:
    """A job through the SDK (from its environment): reports a checkpoint and reads it back as its resume point;
    returns the URI it resumes from. Blocking: run in a thread, the server shares the test's loop."""
    job = Job.from_env({"KUMIKI_JOB_ID": "team-sdk", "KUMIKI_JOB_GENERATION": "1", **env})
    try:
        job.report_checkpoint("s3://ckpt/team-sdk/7", 7)
        again = Job.from_env({"KUMIKI_JOB_ID": "team-sdk", "KUMIKI_JOB_GENERATION": "2", **env})
        try:
            point = again.resume_point()
        finally:
            again.close()
        assert point is not None
        return point.uri
    finally:
        job.close()


async def test_the_sdk_proves_the_job_with_its_token_file_or_its_certificate(served: Served, tmp_path: Path) -> None:
    """What a launcher hands a job is enough: KUMIKI_JOB_TOKEN_FILE (a mounted Secret) over plaintext, or a
    job:<id> certificate with KUMIKI_GRPC_* over mTLS; another job's token is refused through the SDK too."""
    token_file = tmp_path / "token"
    token_file.write_text(job_token(KEY, "team-sdk") + "\n")
    plain = {"KUMIKI_CHECKPOINTS_ADDRESS": served.plain, "KUMIKI_JOB_TOKEN_FILE": str(token_file)}
    assert await asyncio.to_thread(_sdk_round_trip, plain) == "s3://ckpt/team-sdk/7"
    files = served.ca.issue("job:team-sdk")
    secure = {
        "KUMIKI_CHECKPOINTS_ADDRESS": served.secure,
        "KUMIKI_GRPC_CAFILE": str(served.ca.cafile),
        "KUMIKI_GRPC_CERTFILE": str(files.certfile),
        "KUMIKI_GRPC_KEYFILE": str(files.keyfile),
    }
    assert await asyncio.to_thread(_sdk_round_trip, secure) == "s3://ckpt/team-sdk/7"
    stranger = {"KUMIKI_CHECKPOINTS_ADDRESS": served.plain, "KUMIKI_JOB_TOKEN": job_token(KEY, "team/other")}
    with pytest.raises(grpc.RpcError) as refused:
        await asyncio.to_thread(_sdk_round_trip, stranger)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]


def test_the_sdk_names_a_bad_identity_setting(tmp_path: Path) -> None:
    base = {"KUMIKI_JOB_ID": "team-sdk"}
    with pytest.raises(SdkConfigError, match=r"^KUMIKI_JOB_TOKEN_FILE: cannot read"):
        Job.from_env({**base, "KUMIKI_JOB_TOKEN_FILE": str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SdkConfigError, match=r"^KUMIKI_JOB_TOKEN_FILE: .* is empty"):
        Job.from_env({**base, "KUMIKI_JOB_TOKEN_FILE": str(tmp_path / "empty")})
    with pytest.raises(SdkConfigError, match=r"^KUMIKI_JOB_TOKEN_FILE: set KUMIKI_JOB_TOKEN or"):
        Job.from_env({**base, "KUMIKI_JOB_TOKEN": "t", "KUMIKI_JOB_TOKEN_FILE": str(tmp_path / "empty")})
    with pytest.raises(SdkConfigError, match=r"^KUMIKI_GRPC_KEYFILE: "):
        Job.from_env({**base, "KUMIKI_GRPC_CERTFILE": str(tmp_path / "empty")})
