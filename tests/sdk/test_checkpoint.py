"""The SDK without a coordinator: configuration errors name the variable, periodic checkpoints, the binder's
resume fallback, SIGTERM as a checkpoint request; a report's total steps reaching the real Checkpoints service.
With a coordinator: tests/preemption (real processes)."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
import pytest

from kumiki.common.config import DatabaseSettings
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.sdk import Job, ResumePoint, SdkConfigError
from tests.preemption.servers import checkpoints_service


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_settings_are_validated_naming_the_variable() -> None:
    with pytest.raises(SdkConfigError, match="KUMIKI_JOB_ID: required"):
        Job.from_env({})
    with pytest.raises(SdkConfigError, match="KUMIKI_JOB_GENERATION: expected an integer, got 'two'"):
        Job.from_env({"KUMIKI_JOB_ID": "j", "KUMIKI_JOB_GENERATION": "two"})
    with pytest.raises(SdkConfigError, match="KUMIKI_JOB_GENERATION: must be >= 1"):
        Job.from_env({"KUMIKI_JOB_ID": "j", "KUMIKI_JOB_GENERATION": "0"})
    with pytest.raises(SdkConfigError, match="KUMIKI_CHECKPOINT_INTERVAL_S: must be > 0"):
        Job.from_env({"KUMIKI_JOB_ID": "j", "KUMIKI_CHECKPOINT_INTERVAL_S": "-3"})
    with pytest.raises(SdkConfigError, match="KUMIKI_RESUME_STEP"):
        Job.from_env({"KUMIKI_JOB_ID": "j", "KUMIKI_RESUME_STEP": "x"})


def test_periodic_checkpoints_without_a_coordinator() -> None:
    clock = Clock()
    job = Job("team/j", 1, None, interval_s=60.0, clock=clock)
    assert not job.should_checkpoint()
    clock.now += 60.0
    assert job.should_checkpoint()
    assert job.report_checkpoint("file:///c/1", 10)
    assert not job.should_checkpoint() and not job.should_stop() and not job.preempting
    with pytest.raises(ValueError, match="uri: required"):
        job.report_checkpoint("", 1)
    with pytest.raises(ValueError, match="step: must be >= 0"):
        job.report_checkpoint("file:///c/2", -1)
    assert job.resume_point() is None


def test_the_binders_resume_point_wins() -> None:
    env = {
        "KUMIKI_JOB_ID": "j",
        "KUMIKI_JOB_GENERATION": "3",
        "KUMIKI_RESUME_URI": "file:///c/7",
        "KUMIKI_RESUME_STEP": "7",
    }
    assert Job.from_env(env).resume_point() == ResumePoint("file:///c/7", 7, 2)


def test_sigterm_asks_for_a_checkpoint_and_answering_it_means_stop() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        job = Job("team/j", 1, None, interval_s=3600.0, handle_sigterm=True)
        assert not job.should_checkpoint()
        os.kill(os.getpid(), signal.SIGTERM)
        assert job.should_checkpoint() and job.preempting and not job.should_stop()
        job.report_checkpoint("file:///c/5", 5)
        assert job.should_stop()
    finally:
        signal.signal(signal.SIGTERM, previous)


async def test_a_report_carries_the_jobs_total_steps_to_the_checkpoints_service(
    database_settings: DatabaseSettings,
) -> None:
    """The real Checkpoints service (a registry) on loopback: the SDK's blocking calls run off the event loop."""
    async with checkpoints_service(database_settings) as (address, pool):
        job = Job("team/j", 1, address)
        try:
            assert await asyncio.to_thread(job.report_checkpoint, "file:///c/300", 300, total_steps=1200)
            latest = await CheckpointRegistry(pool).latest("team/j")
            assert latest is not None and (latest.step, latest.total_steps) == (300, 1200)
            with pytest.raises(grpc.RpcError) as refused:  # the service's check, surfaced to the job
                await asyncio.to_thread(job.report_checkpoint, "file:///c/400", 400, total_steps=100)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith("total_steps: ")
            with pytest.raises(ValueError, match="total_steps: must be >= 0, got -1"):
                job.report_checkpoint("file:///c/500", 500, total_steps=-1)
        finally:
            job.close()
