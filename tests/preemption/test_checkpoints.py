"""Checkpoints.Report over a real gRPC server on loopback with the real Postgres registry."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, common_pb2
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.preemption.core import CheckpointRecord, lost_work_seconds, supersedes, validate_report
from tests.preemption.servers import checkpoints_service


def test_newer_generation_or_step_supersedes() -> None:
    first = CheckpointRecord("j", 1, "s3://a", 100, 1000.0)
    assert supersedes(first, None)
    assert supersedes(CheckpointRecord("j", 1, "s3://b", 200, 1100.0), first)
    assert not supersedes(CheckpointRecord("j", 1, "s3://old", 50, 1200.0), first)
    assert supersedes(CheckpointRecord("j", 2, "s3://c", 10, 900.0), first)


def test_lost_work_counts_from_the_last_checkpoint() -> None:
    assert lost_work_seconds(5000.0, 1000.0, None) == 4000.0
    assert lost_work_seconds(5000.0, 1000.0, CheckpointRecord("j", 1, "u", 1, 4400.0)) == 600.0


@pytest.fixture
async def stub(database_settings: DatabaseSettings) -> AsyncIterator[checkpoints_pb2_grpc.CheckpointsStub]:
    async with (
        checkpoints_service(database_settings) as (address, _),
        grpc.aio.insecure_channel(address) as channel,
    ):
        yield checkpoints_pb2_grpc.CheckpointsStub(channel)


def report(
    step: int, uri: str, seconds: int, generation: int = 1, total_steps: int = 0
) -> checkpoints_pb2.CheckpointReport:
    message = checkpoints_pb2.CheckpointReport(
        job=common_pb2.JobRef(job_id="team/job", generation=generation), uri=uri, step=step, total_steps=total_steps
    )
    message.completed_at.seconds = seconds
    return message


async def test_reports_keep_the_newest_checkpoint(stub: checkpoints_pb2_grpc.CheckpointsStub) -> None:
    first = await stub.Report(report(100, "s3://ckpt/100", 1_700_000_000))
    assert first.recorded and first.latest_uri == "s3://ckpt/100"
    late = await stub.Report(report(50, "s3://ckpt/50", 1_700_000_100))
    assert not late.recorded and late.latest_uri == "s3://ckpt/100"
    newer = await stub.Report(report(200, "s3://ckpt/200", 1_700_000_200))
    assert newer.recorded and newer.latest_uri == "s3://ckpt/200"


async def test_invalid_report_names_the_field(stub: checkpoints_pb2_grpc.CheckpointsStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Report(report(1, "", 1_700_000_000))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "uri: required"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Report(report(1, "s3://x", 1_700_000_000, generation=0))
    assert error.value.details() == "job.generation: must be >= 1"
    # a completion time past a Timestamp's range (found by tests/fuzz: it crashed the handler, UNKNOWN)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Report(report(1, "s3://x", 2**63 - 1))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith("completed_at: must be before year 10000 (<= 253402300799 s)")
    assert (await stub.Report(report(1, "s3://x", 253_402_300_799))).recorded  # the last second of year 9999


def test_total_steps_is_unknown_or_at_least_the_step() -> None:
    assert validate_report("j", 1, "u", 1000.0, step=300, total_steps=0) == []  # 0: unknown
    assert validate_report("j", 1, "u", 1000.0, step=300, total_steps=300) == []  # the last step
    assert validate_report("j", 1, "u", 1000.0, step=300, total_steps=299) == [
        ("total_steps", "must be 0 (unknown) or >= step (300), got 299")
    ]
    assert validate_report("j", 1, "u", 1000.0, step=1, total_steps=2**63) == [
        ("total_steps", f"must be <= {2**63 - 1}, got {2**63}")
    ]


async def test_a_report_past_its_total_steps_is_refused_naming_the_field_and_total_steps_are_kept(
    database_settings: DatabaseSettings,
) -> None:
    async with (
        checkpoints_service(database_settings) as (address, pool),
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = checkpoints_pb2_grpc.CheckpointsStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.Report(report(500, "s3://ckpt/500", 1_700_000_000, total_steps=400))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == "total_steps: must be 0 (unknown) or >= step (500), got 400"
        accepted = await stub.Report(report(300, "s3://ckpt/300", 1_700_000_100, total_steps=1200))  # still serving
        assert accepted.recorded and accepted.latest_uri == "s3://ckpt/300"
        latest = await CheckpointRegistry(pool).latest("team/job")
    assert latest == CheckpointRecord("team/job", 1, "s3://ckpt/300", 300, 1_700_000_100.0, total_steps=1200)


async def test_resume_point_is_the_newest_checkpoint_of_an_earlier_or_same_attempt(
    stub: checkpoints_pb2_grpc.CheckpointsStub,
) -> None:
    def ask(generation: int) -> checkpoints_pb2.ResumePointRequest:
        return checkpoints_pb2.ResumePointRequest(job=common_pb2.JobRef(job_id="team/job", generation=generation))

    assert not (await stub.ResumePoint(ask(1))).found  # nothing saved yet: start from scratch
    await stub.Report(report(300, "s3://ckpt/300", 1_700_000_300, generation=2))
    point = await stub.ResumePoint(ask(3))
    assert (point.found, point.uri, point.step, point.generation) == (True, "s3://ckpt/300", 300, 2)
    assert not (await stub.ResumePoint(ask(1))).found  # a later attempt's checkpoint is not an earlier one's
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ResumePoint(ask(0))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "job.generation: must be >= 1"


async def test_watch_validates_the_job_and_needs_a_coordinator(stub: checkpoints_pb2_grpc.CheckpointsStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async for _ in stub.Watch(checkpoints_pb2.WatchRequest(job=common_pb2.JobRef(generation=1))):
            pass
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "job.job_id: required"
    with pytest.raises(grpc.aio.AioRpcError) as error:  # this servicer is a registry only
        async for _ in stub.Watch(checkpoints_pb2.WatchRequest(job=common_pb2.JobRef(job_id="j", generation=1))):
            pass
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
