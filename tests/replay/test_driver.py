"""The replay driver's bookkeeping, with no broker: a CHECKPOINT read before its attempt's BOUND is answered
once the BOUND is read (the two topics are read apart), a job is counted done once, the live view's waiting
count never goes below 0 when a preemption is read after the driver released the job, and a job of the
--progress-reports scenario reports step / total_steps at each mark of its progress while it runs.

The driver's reports go over real gRPC to a Checkpoints server on loopback that keeps every report in order;
the preemption service's own server (which keeps only a job's latest checkpoint) takes them in
tests/replay/test_live.py."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from kumiki.common.bus.codec import Event
from kumiki.common.bus.topics import JOB_LIFECYCLE, PREEMPTION_COMMANDS
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import (
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
    events_pb2,
    placement_pb2,
    placement_pb2_grpc,
)
from kumiki.replay.core import ReplayJob
from kumiki.replay.driver import Replay
from tests.conftest import wait_until


class Reports(checkpoints_pb2_grpc.CheckpointsServicer):
    """A Checkpoints server that acknowledges every report and keeps them in the order they arrived."""

    def __init__(self) -> None:
        self.received: list[checkpoints_pb2.CheckpointReport] = []

    async def Report(
        self, request: checkpoints_pb2.CheckpointReport, context: grpc.aio.ServicerContext
    ) -> checkpoints_pb2.CheckpointAck:
        self.received.append(request)
        return checkpoints_pb2.CheckpointAck()


@contextlib.asynccontextmanager
async def on_loopback(add: Callable[[grpc.aio.Server], None]) -> AsyncIterator[grpc.aio.Channel]:
    """A gRPC server with what `add` puts on it, on a free loopback port, and a channel to it."""
    server = grpc.aio.server()
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(None)


@pytest.fixture
async def reports() -> AsyncIterator[tuple[Reports, checkpoints_pb2_grpc.CheckpointsStub]]:
    """The recording server on loopback and a client stub for it, as the driver builds one."""
    servicer = Reports()  # type: ignore[abstract]  # only Report is called here
    async with on_loopback(
        lambda server: checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(servicer, server)
    ) as channel:
        yield servicer, checkpoints_pb2_grpc.CheckpointsStub(channel)


def replay_of(jobs: list[ReplayJob], *, speed: float = 1000, preemptible: bool = True, **options: Any) -> Replay:
    """A driver over `jobs` that no test here lets reach Placement or Kafka (what it would call is handed in)."""
    return Replay(
        jobs,
        placement_address="unused",
        kafka=KafkaSettings(),
        speed=speed,
        phase=options.pop("phase", "p"),
        preemptible=preemptible,
        **options,
    )


def event(topic: Any, key: str, payload: Any) -> Event:
    return Event(topic=topic, key=key, payload=payload, attributes=None)  # type: ignore[arg-type]


def bound(key: str, generation: int) -> events_pb2.JobLifecycle:
    message = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=key, generation=generation),
        state=events_pb2.JOB_STATE_BOUND,
        assignments=[common_pb2.PodAssignment(node="n", gpu_indices=[0])],
        gpus=1,
    )
    message.at.GetCurrentTime()
    return message


async def test_a_checkpoint_read_before_its_bind_is_answered_when_the_bind_is_read(
    reports: tuple[Reports, checkpoints_pb2_grpc.CheckpointsStub],
) -> None:
    job = ReplayJob("zombie", "q", 0.0, 10_000.0, 1, (1,), True)
    replay = replay_of([job])
    server, replay._checkpoints = reports
    (key,) = replay.tracks
    command = events_pb2.PreemptionCommand(
        job=common_pb2.JobRef(job_id=key, generation=1),
        action=events_pb2.PREEMPTION_ACTION_CHECKPOINT,
        command_id="c1",
    )
    await replay._on_command(key, event(PREEMPTION_COMMANDS, key, command))
    assert server.received == []  # its BOUND has not been read: nothing to checkpoint yet
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 1)))
    await asyncio.gather(*replay._pending_calls)
    assert [(r.job.generation, r.command_id) for r in server.received] == [(1, "c1")]
    replay.tracks[key].release.cancel()  # type: ignore[union-attr]


def test_a_job_is_counted_done_once() -> None:
    jobs = [ReplayJob(name, "q", 0.0, 1.0, 1, (1,), False) for name in ("a", "b")]
    replay = replay_of(jobs, speed=1, preemptible=False)
    first = next(iter(replay.tracks.values()))
    replay._finished(first)
    stamp = first.ended_wall
    time.sleep(0.001)
    replay._finished(first)
    assert replay.counts.done == 1 and first.ended_wall == stamp and not replay._done.is_set()


async def test_a_generation_requeued_after_the_driver_released_the_job_does_not_count_as_left_waiting() -> None:
    """Placement preempts a job just as the driver releases it: the PREEMPTED is read after the release (too late
    to count the job waiting again), and the next generation's BOUND must not take the waiting count below 0."""
    job = ReplayJob("late", "q", 0.0, 10_000.0, 1, (1,), False)
    replay = replay_of([job])
    (key,) = replay.tracks
    track = replay.tracks[key]
    replay._submitted(track)
    assert replay.counts.waiting == 1
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 1)))
    assert (replay.counts.waiting, replay.counts.running) == (0, 1)
    track.release.cancel()  # type: ignore[union-attr]
    replay._unhold(key, track, time.time())  # what the driver's own release does first
    replay._finished(track)
    preempted = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=key, generation=1), state=events_pb2.JOB_STATE_PREEMPTED
    )
    preempted.at.GetCurrentTime()
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, preempted))  # read after the release: ignored
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 2)))
    assert (replay.counts.waiting, replay.counts.running) == (0, 1)
    track.release.cancel()  # type: ignore[union-attr]
    # a preemption read while the job runs counts it waiting once, and its next bind takes it off again
    replay._preempted(key, track, 2, time.time(), 0.0)
    assert (replay.counts.waiting, replay.counts.running) == (1, 0)
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 3)))
    assert (replay.counts.waiting, replay.counts.running) == (0, 1)
    track.release.cancel()  # type: ignore[union-attr]


async def test_telemetrys_delay_is_measured_per_attempt_from_its_bind_to_the_findings_own_time() -> None:
    """The delay the twin is given: trace seconds from an attempt's BOUND to the gpu.idle event's time, for the
    attempt that is bound (a finding repeated or for an earlier attempt adds nothing), and from that finding to
    the attempt's PREEMPTED when idle reclaim evicts it."""
    from datetime import UTC, datetime

    from kumiki.common.bus.cloudevents import CloudEventAttributes
    from kumiki.common.bus.topics import GPU_IDLE

    job = ReplayJob("zombie", "q", 0.0, 10_000.0, 1, (1,), True)
    replay = replay_of([job])
    (key,) = replay.tracks
    track = replay.tracks[key]
    replay._submitted(track)
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 1)))
    track.release.cancel()  # type: ignore[union-attr]

    def finding(generation: int, after_wall_s: float) -> Event:
        message = events_pb2.GpuIdle(job=common_pb2.JobRef(job_id=key, generation=generation), queue="q")
        at = datetime.fromtimestamp(track.started_wall + after_wall_s, UTC)
        return Event(GPU_IDLE, key, message, CloudEventAttributes.new("kumiki.gpu.idle", "//t", time=at))

    replay._preempted(key, track, 1, time.time(), 0.0)  # not found while it ran
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 2)))
    track.release.cancel()  # type: ignore[union-attr]
    await replay._on_idle(key, finding(1, 0.5))  # read late, for the attempt before: found, but not this delay
    await replay._on_idle(key, finding(2, 1.25))
    await replay._on_idle(key, finding(2, 2.0))  # the same attempt, found again: counted once
    assert track.found_wall is not None
    replay._preempted(key, track, 2, track.found_wall + 0.9, 0.0)  # idle reclaim evicts it 0.9 s after
    await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 3)))
    track.release.cancel()  # type: ignore[union-attr]
    (outcome,) = _ended(replay, key, track)
    assert outcome.found_idle == 2 and outcome.reclaimed == 1
    assert outcome.found_after_s == pytest.approx((1250.0,), abs=1.0)  # wall x speed
    assert outcome.reclaimed_after_s == pytest.approx((900.0,))


def _ended(replay: Replay, key: str, track: Any) -> list[Any]:
    replay._unhold(key, track, time.time())
    track.ended_wall = time.time()
    return replay.outcomes()


async def test_a_reporting_job_reports_its_progress_at_each_mark_while_it_runs_and_not_after(
    reports: tuple[Reports, checkpoints_pb2_grpc.CheckpointsStub],
) -> None:
    jobs = [
        ReplayJob("reports", "q", 0.0, 10_000.0, 8, (8,), False),
        ReplayJob("zombie", "q", 0.0, 10_000.0, 8, (8,), True),  # computes nothing: no progress to report
        ReplayJob("quiet", "q", 0.0, 10_000.0, 8, (8,), False),  # not drawn to report
        ReplayJob("preempted", "q", 0.0, 1e6, 8, (8,), False),
    ]
    # 100,000x: the marks at 1,800, 3,600 and 7,200 trace seconds fall 18, 36 and 72 ms after the bind
    progress = {"reports": 1.5, "zombie": 1.0, "preempted": 1.0}
    replay = replay_of(jobs, speed=100_000, progress=progress)
    server, replay._checkpoints = reports
    keys = {track.job.job_id: key for key, track in replay.tracks.items()}
    for key, track in replay.tracks.items():
        await replay._on_lifecycle(key, event(JOB_LIFECYCLE, key, bound(key, 1)))
        track.release.cancel()  # type: ignore[union-attr]  # no placement here to release them to
    assert replay.tracks[keys["zombie"]].report is None and replay.tracks[keys["quiet"]].report is None

    def sent(job: str) -> list[tuple[int, int, int]]:
        return [(r.job.generation, r.step, r.total_steps) for r in server.received if r.job.job_id == keys[job]]

    await wait_until(lambda: len(sent("reports")) == 3 and sent("preempted"), what="the reports")
    preempted = replay.tracks[keys["preempted"]]
    replay._preempted(keys["preempted"], preempted, 1, time.time(), 0.0)
    assert preempted.report is None, "an evicted attempt reports no more"
    await wait_until(lambda: replay.tracks[keys["reports"]].report is None, what="the last mark before its end")
    await asyncio.gather(*replay._pending_calls)
    # a total off by its factor (1.5 x 10,000 steps); 14,400 s is past its end, so three reports
    assert sent("reports") == [(1, 1800, 15_000), (1, 3600, 15_000), (1, 7200, 15_000)]
    assert all(r.completed_at.seconds > 0 and not r.command_id for r in server.received), "periodic, not asked"
    assert replay.progress_reported == len(server.received) and not sent("zombie") and not sent("quiet")


def test_a_trace_job_is_named_afresh_in_each_run_and_phase_so_its_earlier_run_times_are_no_oracle() -> None:
    job = ReplayJob("philly-7", "q", 0.0, 100.0, 8, (8,), False)
    names = set()
    for run_id, phase in (("r1", "baseline"), ("r1", "kumiki"), ("r2", "kumiki")):
        replay = replay_of([job], speed=1, phase=phase, run_id=run_id)
        (key,) = replay.tracks
        request = replay.bind_request(key, job)
        assert request.name == request.job.job_id == key and "philly-7" in key
        names.add(request.name)
    assert len(names) == 3, "the forecaster keys history on the name: never the same across replays"


class Explains(placement_pb2_grpc.PlacementServicer):
    """A Placement server that answers Explain only: every job pending behind the same reason, each ask kept."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def Explain(
        self, request: placement_pb2.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ExplainResponse:
        self.asked.append(request.job_id)
        reason = common_pb2.PendingReason(code="insufficient_gpus", message="no node has 8 free GPUs")
        return placement_pb2.ExplainResponse(status="pending", queue="q", queue_position=1, reasons=[reason])


async def test_a_replay_that_stops_moving_asks_placement_why_its_longest_waiting_jobs_wait() -> None:
    """Nothing moves for the stall time while two jobs wait: the driver asks Placement (Explain, over real gRPC on
    loopback) about them, longest waiting first, and logs its answers; the running job is not asked about."""
    servicer = Explains()  # type: ignore[abstract]  # only Explain is called here
    jobs = [ReplayJob(name, "q", 0.0, 10_000.0, 8, (8,), False) for name in ("runs", "first", "second")]
    replay = replay_of(jobs, preemptible=False, stall_after_s=0.2)
    runs, first, second = replay.tracks
    for key in (runs, first, second):
        replay._submitted(replay.tracks[key])
    replay.tracks[first].queued_wall -= 2.0  # it has waited longest (2 wall s: 2,000 trace s)
    await replay._on_lifecycle(runs, event(JOB_LIFECYCLE, runs, bound(runs, 1)))
    stopping = asyncio.Event()
    async with on_loopback(
        lambda server: placement_pb2_grpc.add_PlacementServicer_to_server(servicer, server)
    ) as channel:
        replay._stub = placement_pb2_grpc.PlacementStub(channel)
        watch = asyncio.create_task(replay._watch_stalls(stopping))
        try:
            await wait_until(lambda: len(replay.stalls) >= 2, timeout_s=30, what="a stall report")
        finally:
            stopping.set()
            await watch
            replay.tracks[runs].release.cancel()  # type: ignore[union-attr]
    assert servicer.asked[:2] == [first, second]
    assert replay.stalls[0].startswith(f"still waiting: {first} has waited 2,")
    assert replay.stalls[0].endswith(
        "placement says pending, position 1 in queue q (insufficient_gpus: no node has 8 free GPUs)"
    )
    assert all(runs not in line for line in replay.stalls)
