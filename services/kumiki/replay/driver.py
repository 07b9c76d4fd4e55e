"""The live replay: a trace's jobs submitted to the running services at accelerated time, through the path a
cluster integration uses (Placement.Bind), on an emulated cluster published on cluster.state.

The driver keeps no scheduling logic: placement decides, quota admits, and the driver only learns what
happened from `job.lifecycle` (BOUND, PREEMPTED, the endings), the same events every other consumer reads. A
job is released as completed its trace duration (divided by the speed-up) after the BOUND event's own time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import grpc

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.codec import Event
from kumiki.common.bus.replay import TopicReader
from kumiki.common.bus.topics import ALL_TOPICS, CLUSTER_STATE, GPU_IDLE, JOB_LIFECYCLE, PREEMPTION_COMMANDS
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import (
    checkpoints_pb2,
    checkpoints_pb2_grpc,
    common_pb2,
    events_pb2,
    placement_pb2,
    placement_pb2_grpc,
)
from kumiki.common.grpcutil import client_channel, unix_seconds
from kumiki.devstack.cluster import NodeShape, emulated_nodes
from kumiki.replay.core import Outcome, ReplayJob, next_report_mark
from kumiki.replay.nodes import NodeAgents
from kumiki.replay.stalls import STALL_AFTER_S, STALL_JOBS, StallWatch, placement_said, pods_said, still_waiting

log = logging.getLogger(__name__)

REPLAY_SHAPE = NodeShape("A100-80GB", 8, 81920, 8, 128_000, 1_048_576)
EMULATED_LABEL = "kumiki.dev/emulated"
RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
ENDINGS = {events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED, events_pb2.JOB_STATE_RELEASED}


@dataclass
class LiveCounts:
    """What the live view shows; updated by the driver, read by the CLI's progress display."""

    phase: str = ""
    planned: int = 0
    submitted: int = 0
    waiting: int = 0
    running: int = 0
    done: int = 0
    preempted: int = 0
    gpus_allocated: int = 0
    gpus_busy: int = 0
    idle_gpus: int = 0
    idle_found: int = 0  # job attempts telemetry reported idle (gpu.idle)
    idle_reclaimed: int = 0  # of those, attempts placement then preempted
    binds: int = 0
    started_wall: float = field(default_factory=time.monotonic)

    def start(self, phase: str, planned: int) -> None:
        """Fresh counters for a phase (the live view keeps the same object across phases)."""
        for item in fields(self):
            setattr(self, item.name, item.default_factory() if item.default_factory is not MISSING else item.default)
        self.phase, self.planned = phase, planned

    @property
    def binds_per_s(self) -> float:
        return self.binds / max(1e-9, time.monotonic() - self.started_wall)


@dataclass
class _Track:
    job: ReplayJob
    submitted_wall: float = 0.0
    bound_wall: float | None = None
    generation: int = 0
    executed_s: float = 0.0  # trace seconds of progress kept across preemptions
    runs: int = 0
    started_wall: float = 0.0  # when the current generation was bound
    lost_gpu_s: float = 0.0  # trace GPU-seconds of work lost to preemptions
    release: asyncio.TimerHandle | None = None
    report: asyncio.TimerHandle | None = None  # the next progress report of the running attempt (a reporter's)
    ended_wall: float | None = None
    holds: list[tuple[float, float]] = field(default_factory=list)  # wall (bound, freed) of each attempt
    running: bool = False  # the current generation is bound and has not ended
    # counted in `counts.waiting`: submitted or preempted, not bound since (a generation placement requeued after
    # the driver released the job, its PREEMPTED read too late to count, is bound without having been counted)
    queued: bool = False
    queued_wall: float = 0.0  # when it last began to wait (submitted, or its attempt preempted)
    early_checkpoint: events_pb2.PreemptionCommand | None = None  # a CHECKPOINT read before its attempt's BOUND
    found_idle: set[int] = field(default_factory=set)  # generations telemetry reported idle
    # per attempt found while bound: wall seconds from its BOUND to telemetry's gpu.idle (the event's own time)
    found_after_wall: list[float] = field(default_factory=list)
    found_wall: float | None = None  # when telemetry found the bound attempt (the gpu.idle event's time)
    # per attempt reclaimed after it was found while bound: wall seconds from the finding to its PREEMPTED
    reclaimed_after_wall: list[float] = field(default_factory=list)
    reclaimed: int = 0


@dataclass
class LogEntry:
    """One job.lifecycle event of this run, for the invariant checks: kind, job, generation, GPUs."""

    kind: str
    job_id: str
    generation: int
    gpus: frozenset[tuple[str, int]]
    at_wall: float
    at_us: int  # the event's own time in whole microseconds, as the quota ledger meters it
    gpu_demand: float = 0.0


@dataclass
class ReplayCluster:
    """The replay's nodes, and the other emulated nodes it cordoned for its run (given back by `restore`)."""

    nodes: list[events_pb2.NodeState]
    cordoned: list[events_pb2.NodeState]


def _with_health(state: events_pb2.NodeState, healthy: bool) -> events_pb2.NodeState:
    copy = events_pb2.NodeState()
    copy.CopyFrom(state)
    copy.healthy = healthy
    copy.version.version += 1
    copy.last_seen.GetCurrentTime()
    return copy


async def publish_cluster(kafka: KafkaSettings, nodes: int, prefix: str = "replay") -> ReplayCluster:
    """`nodes` uniform 8-GPU nodes on cluster.state; other emulated nodes are marked unhealthy (placement gives
    them nothing), so the replay runs on exactly the cluster it names."""
    await ensure_topics(kafka, ALL_TOPICS)
    ours = emulated_nodes(nodes, shapes=(REPLAY_SHAPE,), prefix=prefix) if nodes else []
    names = {node.node for node in ours}
    others: dict[str, events_pb2.NodeState] = {}

    async def seen(key: str, event: Event | None) -> None:
        if event is None:
            others.pop(key, None)
            return
        state = event.payload
        assert isinstance(state, events_pb2.NodeState)
        others[key] = state

    reader = TopicReader(kafka, CLUSTER_STATE, seen)
    await reader.start()
    try:
        await reader.catch_up(timeout_s=60)
    finally:
        await reader.stop()
    cordoned = [
        _with_health(state, False)
        for name, state in others.items()
        if name not in names and state.labels.get(EMULATED_LABEL) == "true" and state.healthy
    ]
    async with EventProducer(kafka, "//kumiki/replay") as producer:
        await producer.publish_many(CLUSTER_STATE, [(node.node, node) for node in (*cordoned, *ours)])
    return ReplayCluster(ours, cordoned)


async def restore_cluster(kafka: KafkaSettings, cluster: ReplayCluster) -> None:
    """The cluster as the replay found it: its own nodes cordoned (their agents stop, telemetry would find them
    silent anyway), the emulated nodes it cordoned healthy again."""
    states = [_with_health(node, False) for node in cluster.nodes]
    states += [_with_health(node, True) for node in cluster.cordoned]
    async with EventProducer(kafka, "//kumiki/replay") as producer:
        await producer.publish_many(CLUSTER_STATE, [(node.node, node) for node in states])


class Replay:
    """One phase: submit every job at its (accelerated) time, release each when its run is over, return outcomes."""

    def __init__(
        self,
        jobs: Sequence[ReplayJob],
        *,
        placement_address: str,
        kafka: KafkaSettings,
        speed: float,
        phase: str,
        preemptible: bool,
        run_id: str | None = None,
        counts: LiveCounts | None = None,
        checkpoints_address: str | None = None,
        channel_factory: Callable[[str], grpc.aio.Channel] = client_channel,  # mTLS when KUMIKI_GRPC_* say so
        agents: NodeAgents | None = None,
        progress: Mapping[str, float] | None = None,
        stall_after_s: float = STALL_AFTER_S,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be > 0, got {speed}")
        self.jobs = list(jobs)
        self.address = placement_address
        self.kafka = kafka
        self.speed = speed
        self.phase = phase
        self.preemptible = preemptible
        self.run_id = run_id or uuid.uuid4().hex[:8]
        self.prefix = self.job_prefix()
        self.counts = counts or LiveCounts()
        self.channel_factory = channel_factory
        self.agents = agents  # the nodes' agents: told who holds which GPUs, they sample accordingly
        # where the jobs report checkpoints: the replay answers the coordinator's CHECKPOINT commands at once, as
        # a job using the SDK does (None: victims wait for the coordinator's deadline and are evicted forced)
        self.checkpoints_address = checkpoints_address
        self._checkpoints: checkpoints_pb2_grpc.CheckpointsStub | None = None
        self.checkpoints_reported = 0
        # the --progress-reports scenario: trace job -> the factor its reports are off by (`ProgressReports`); those
        # jobs report step / total_steps at each mark of their progress, as jobs using the SDK can
        self.progress = dict(progress or {})
        self.progress_reported = 0
        self.tracks = {self.key_for(index, job): _Track(job) for index, job in enumerate(self.jobs)}
        self.log: list[LogEntry] = []
        self.errors: list[str] = []
        self._t0 = 0.0
        self._done = asyncio.Event()
        self._stub: placement_pb2_grpc.PlacementStub | None = None
        self._pending_calls: set[asyncio.Task[None]] = set()
        self.stall_watch = StallWatch(stall_after_s)
        self.stalls: list[str] = []  # what each stall report said (also logged)

    # ---- how jobs are named, started and ended (the Kubernetes replay overrides these) ----------------------
    def job_prefix(self) -> str:
        """What every job id of this phase starts with (events of other runs and phases are not ours)."""
        return f"{self.run_id}-{self.phase}-"

    def key_for(self, index: int, job: ReplayJob) -> str:
        """The job id the services see for the trace's `index`-th job."""
        return self.prefix + job.job_id

    def _schedule_end(self, key: str, track: _Track, started_wall: float) -> None:
        """The job's run is over its remaining trace duration after `started_wall`: release it then."""
        remaining_wall = max(0.0, track.job.duration_s - track.executed_s) / self.speed
        delay = max(0.0, started_wall + remaining_wall - time.time())
        track.release = asyncio.get_running_loop().call_later(delay, self._release_soon, key, track, started_wall)

    def _ended(self, key: str, track: _Track, generation: int, at_wall: float) -> None:
        """An ending event of the job: here the driver released it itself, so nothing is left to do."""

    def _requeued(self, key: str, track: _Track) -> None:
        """A preempted job: Placement queued its next generation already."""

    async def _open(self) -> None:
        """What the phase needs before the first job (the Kubernetes replay: its namespace and nodes)."""

    async def _close(self) -> None:
        """Undo `_open` (after the last job)."""

    async def _pods_of(self, key: str) -> list[dict[str, Any]]:
        """The job's pods as the API server has them (the Kubernetes replay; none here)."""
        return []

    # ---- stalls -------------------------------------------------------------------------------------------
    async def stall_report(self) -> list[str]:
        """Why the jobs that have waited longest still wait: Placement's Explain of each, and its pods' states."""
        if self._stub is None:  # not running
            return []
        waiting = sorted((track.queued_wall, key) for key, track in self.tracks.items() if track.queued)
        lines: list[str] = []
        for queued_wall, key in waiting[:STALL_JOBS]:
            waited_s = (time.time() - queued_wall) * self.speed
            try:
                reply = await self._stub.Explain(placement_pb2.ExplainRequest(job_id=key), timeout=10.0)
                lines.append(placement_said(key, waited_s, reply))
            except grpc.aio.AioRpcError as error:
                lines.append(f"{still_waiting(key, waited_s)}; Explain: {error.code().name}")
            with contextlib.suppress(Exception):  # what the pods say only adds to the line above
                lines += pods_said(await self._pods_of(key))
        return lines

    async def _watch_stalls(self, stopping: asyncio.Event) -> None:
        """Every few seconds: when nothing moved for `stall_watch.after_s` while jobs wait, log why they wait."""
        interval_s = max(0.05, min(5.0, self.stall_watch.after_s / 4))
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=interval_s)
            counts = self.counts
            mark = (counts.submitted, counts.waiting, counts.running, counts.done, counts.preempted, counts.binds)
            if self.stall_watch.due(mark, counts.waiting, time.monotonic()):
                for line in await self.stall_report():
                    log.warning(line)
                    self.stalls.append(line)

    # ---- clock --------------------------------------------------------------------------------------------
    def trace_s(self, wall: float) -> float:
        return (wall - self._t0) * self.speed

    # ---- lifecycle --------------------------------------------------------------------------------------
    async def _on_lifecycle(self, key: str, event: Event | None) -> None:
        if event is None or not key.startswith(self.prefix):
            return
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        track = self.tracks.get(key)
        if track is None:
            return
        at = unix_seconds(message.at)
        at_us = message.at.seconds * 1_000_000 + message.at.nanos // 1000
        generation = message.job.generation
        gpus = frozenset((a.node, int(index)) for a in message.assignments for index in a.gpu_indices)
        if message.state == events_pb2.JOB_STATE_BOUND:
            self.log.append(LogEntry("bound", key, generation, gpus, at, at_us, message.gpus))
            if track.bound_wall is not None and track.generation == generation:
                return  # the same bind seen twice
            self._bound(key, track, generation, at, gpus)
        elif message.state == events_pb2.JOB_STATE_PREEMPTED:
            self.log.append(LogEntry("ended", key, generation, gpus, at, at_us))
            self._preempted(key, track, generation, at, message.lost_gpu_seconds)
        elif message.state in ENDINGS:
            self.log.append(LogEntry("ended", key, generation, gpus, at, at_us))
            self._ended(key, track, generation, at)

    def _bound(
        self, key: str, track: _Track, generation: int, at_wall: float, gpus: frozenset[tuple[str, int]]
    ) -> None:
        if self.agents is not None:
            self.agents.hold(key, gpus, idle=track.job.idle)
        track.bound_wall = at_wall if track.runs == 0 else track.bound_wall
        track.generation = generation
        track.found_wall = None
        track.runs += 1
        track.started_wall = track_started = at_wall
        track.running = True
        early, track.early_checkpoint = track.early_checkpoint, None
        if early is not None and early.job.generation == generation:
            self._answer(key, track, early)
        self.counts.binds += 1  # at arrival or by a scheduling pass: every BOUND counts
        self._dequeued(track)
        self.counts.running += 1
        self.counts.gpus_allocated += track.job.gpus
        self.counts.gpus_busy += 0 if track.job.idle else track.job.gpus
        self.counts.idle_gpus += track.job.gpus if track.job.idle else 0
        self._schedule_end(key, track, track_started)
        self._schedule_report(key, track, track.executed_s)

    def _schedule_report(self, key: str, track: _Track, done_s: float) -> None:
        """A job that reports its progress reports at its next mark past `done_s` (trace seconds of work) while this
        attempt runs. A zombie computes nothing, so it has no progress to report."""
        factor = self.progress.get(track.job.job_id)
        if factor is None or track.job.idle or self._checkpoints is None:
            return
        mark = next_report_mark(done_s, track.job.duration_s)
        if mark is None:
            return
        delay = max(0.0, track.started_wall + (mark - track.executed_s) / self.speed - time.time())
        track.report = asyncio.get_running_loop().call_later(
            delay, self._report_progress, key, track, track.generation, mark, factor
        )

    def _report_progress(self, key: str, track: _Track, generation: int, mark: float, factor: float) -> None:
        """Checkpoint `mark` of a total the job believes is its duration x `factor` (a report that misleads by it)."""
        track.report = None
        if not track.running or track.generation != generation:
            return
        step = int(mark)
        report = checkpoints_pb2.CheckpointReport(
            job=common_pb2.JobRef(job_id=key, generation=generation),
            uri=f"replay://{key}/{generation}/{step}",
            step=step,
            total_steps=max(step, round(track.job.duration_s * factor)),
        )
        report.completed_at.GetCurrentTime()
        self.progress_reported += 1
        self._spawn(self._report(key, report))
        self._schedule_report(key, track, mark)

    def _preempted(self, key: str, track: _Track, generation: int, at_wall: float, lost_gpu_seconds: float) -> None:
        if not track.running or track.generation != generation:
            return
        if track.release is not None:
            track.release.cancel()
            track.release = None
        # progress kept: what ran since the bind, less what the coordinator says was lost (wall GPU-seconds, from
        # its newest acknowledged checkpoint to the eviction)
        lost_s = lost_gpu_seconds * self.speed / max(1, track.job.gpus)
        ran_s = (at_wall - track.started_wall) * self.speed
        track.executed_s = min(track.job.duration_s, track.executed_s + max(0.0, ran_s - lost_s))
        track.lost_gpu_s += lost_gpu_seconds * self.speed
        self.counts.preempted += 1
        if generation in track.found_idle:
            track.reclaimed += 1
            self.counts.idle_reclaimed += 1
            if track.found_wall is not None:
                track.reclaimed_after_wall.append(max(0.0, at_wall - track.found_wall))
        self._unhold(key, track, at_wall)
        self._queued(track)
        self._requeued(key, track)

    def _unhold(self, key: str, track: _Track, at_wall: float) -> None:
        """The attempt freed its GPUs (once per attempt: its release or its preemption)."""
        track.running = False
        if track.report is not None:
            track.report.cancel()
            track.report = None
        if self.agents is not None:
            self.agents.free(key)
        track.holds.append((track.started_wall, at_wall))
        self.counts.running -= 1
        self.counts.gpus_allocated -= track.job.gpus
        self.counts.gpus_busy -= 0 if track.job.idle else track.job.gpus
        self.counts.idle_gpus -= track.job.gpus if track.job.idle else 0

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """A call made in the background; the phase ends only once every one has returned."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._pending_calls.add(task)
        task.add_done_callback(self._pending_calls.discard)

    def _release_soon(self, key: str, track: _Track, started_wall: float) -> None:
        track.release = None
        track.running = False  # over: a PREEMPTED read before the Release goes out changes nothing
        self._spawn(self._release(key, track, started_wall))

    async def _release(self, key: str, track: _Track, started_wall: float) -> None:
        assert self._stub is not None
        self._unhold(key, track, time.time())
        request = placement_pb2.ReleaseRequest(
            job=common_pb2.JobRef(job_id=key, generation=track.generation),
            reason="replay: trace duration elapsed",
            final_state=events_pb2.JOB_STATE_COMPLETED,
        )
        try:
            await self._call(self._stub.Release, request)
        except grpc.aio.AioRpcError as error:
            self.errors.append(f"{key}: Release: {error.code().name}: {error.details()}")
        track.executed_s = track.job.duration_s
        self._finished(track)

    def _finished(self, track: _Track) -> None:
        if track.ended_wall is not None:
            return  # counted once: an attempt requeued after its work was done ends again
        track.ended_wall = time.time()
        self.counts.done += 1
        if self.counts.done >= len(self.tracks):
            self._done.set()

    def _submitted(self, track: _Track) -> None:
        track.submitted_wall = time.time()
        self.counts.submitted += 1
        self._queued(track)

    def _queued(self, track: _Track) -> None:
        if not track.queued:
            track.queued = True
            track.queued_wall = time.time()
            self.counts.waiting += 1

    def _dequeued(self, track: _Track) -> None:
        if track.queued:
            track.queued = False
            self.counts.waiting -= 1

    async def _on_idle(self, key: str, event: Event | None) -> None:
        """gpu.idle for one of this run's jobs: telemetry found a zombie (counted once per attempt)."""
        if event is None or not key.startswith(self.prefix):
            return
        finding = event.payload
        assert isinstance(finding, events_pb2.GpuIdle)
        track = self.tracks.get(finding.job.job_id)
        if track is None or finding.job.generation in track.found_idle:
            return
        track.found_idle.add(finding.job.generation)
        self.counts.idle_found += 1
        if track.running and finding.job.generation == track.generation:
            track.found_wall = event.attributes.time.timestamp()
            track.found_after_wall.append(track.found_wall - track.started_wall)

    async def _on_command(self, key: str, event: Event | None) -> None:
        """CHECKPOINT for one of this run's jobs: report a checkpoint at once, answering the command."""
        if event is None or not key.startswith(self.prefix) or self._checkpoints is None:
            return
        command = event.payload
        assert isinstance(command, events_pb2.PreemptionCommand)
        track = self.tracks.get(key)
        if command.action != events_pb2.PREEMPTION_ACTION_CHECKPOINT or track is None:
            return
        if command.job.generation > track.generation:
            track.early_checkpoint = command  # the topics are read apart: answered when its BOUND is read
            return
        self._answer(key, track, command)

    def _answer(self, key: str, track: _Track, command: events_pb2.PreemptionCommand) -> None:
        """Report a checkpoint for the command's attempt, if that attempt still runs."""
        if command.job.generation != track.generation or not track.running:
            return  # an attempt that has ended already
        progress = track.executed_s + (time.time() - track.started_wall) * self.speed
        report = checkpoints_pb2.CheckpointReport(
            job=command.job,
            uri=f"replay://{key}/{command.job.generation}/{int(progress)}",
            step=int(progress),
            command_id=command.command_id,
        )
        report.completed_at.GetCurrentTime()
        self._spawn(self._report(key, report))

    async def _report(self, key: str, report: checkpoints_pb2.CheckpointReport) -> None:
        assert self._checkpoints is not None
        try:
            await self._call(self._checkpoints.Report, report)
            self.checkpoints_reported += 1
        except grpc.aio.AioRpcError as error:
            self.errors.append(f"{key}: Checkpoints.Report: {error.code().name}: {error.details()}")

    async def _call(self, method: Callable[..., Awaitable[object]], request: object) -> object:
        """A call retried while the service is briefly unavailable (a restart), with a bounded number of tries.
        A deadline is retried too: Bind and Release are idempotent per job and generation, and a call that timed
        out may still have taken effect (its events acknowledged late, as when the broker restarts)."""
        for attempt in range(30):
            try:
                return await method(request, timeout=30)
            except grpc.aio.AioRpcError as error:
                if error.code() not in RETRIED_CODES or attempt == 29:
                    raise
                await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
        raise AssertionError("unreachable")

    # ---- submission -------------------------------------------------------------------------------------
    def bind_request(self, key: str, job: ReplayJob) -> placement_pb2.BindRequest:
        """The job's Bind. Its name is its id in this run and phase, not the trace's: the forecaster keys a job's
        history on its name, and a trace job replayed again (the next phase, the next `kumiki up` on the same
        database) would otherwise be forecast from its own earlier run times, an oracle a real job does not have."""
        return placement_pb2.BindRequest(
            job=common_pb2.JobRef(job_id=key, generation=1),
            queue=job.queue,
            pods=[common_pb2.PodResources(gpus=gpus) for gpus in job.pods],
            preemptible=self.preemptible,
            name=key,
        )

    async def _submit(self, key: str, track: _Track) -> None:
        assert self._stub is not None
        request = self.bind_request(key, track.job)
        self._submitted(track)
        try:
            reply = await self._call(self._stub.Bind, request)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION and track.ended_wall is not None:
                return  # a retry that outlived the job: placement refuses to run an ended generation again
            self.errors.append(f"{key}: Bind: {error.code().name}: {error.details()}")
            self._dequeued(track)
            self._finished(track)
            return
        assert isinstance(reply, placement_pb2.BindResponse)

    async def run(self, timeout_s: float | None = None) -> list[Outcome]:
        """Replay every job; returns one outcome per job that ended (in trace seconds from the start)."""
        self.counts.start(self.phase, len(self.tracks))
        reader = TopicReader(self.kafka, JOB_LIFECYCLE, self._on_lifecycle)
        await reader.start()
        await reader.catch_up()
        stopping = asyncio.Event()
        follower = asyncio.create_task(reader.follow(stopping), name="replay-lifecycle")
        idle_reader = TopicReader(self.kafka, GPU_IDLE, self._on_idle)
        await idle_reader.start()
        await idle_reader.catch_up()  # older runs' findings: not ours
        idle_task = asyncio.create_task(idle_reader.follow(stopping), name="replay-idle")
        channel = self.channel_factory(self.address)
        self._stub = placement_pb2_grpc.PlacementStub(channel)
        commands: TopicReader | None = None
        commands_task: asyncio.Task[None] | None = None
        stalls_task: asyncio.Task[None] | None = None
        checkpoints_channel = None
        if self.checkpoints_address is not None:
            checkpoints_channel = self.channel_factory(self.checkpoints_address)
            self._checkpoints = checkpoints_pb2_grpc.CheckpointsStub(checkpoints_channel)
            commands = TopicReader(self.kafka, PREEMPTION_COMMANDS, self._on_command)
            await commands.start()
            await commands.catch_up()  # older runs' commands: not ours (the prefix differs), skipped
            commands_task = asyncio.create_task(commands.follow(stopping), name="replay-commands")
        try:
            await self._open()
            self._t0 = time.time()
            self.counts.started_wall = time.monotonic()
            stalls_task = asyncio.create_task(self._watch_stalls(stopping), name="replay-stalls")
            for key, track in self.tracks.items():
                due = self._t0 + track.job.submit_s / self.speed
                delay = due - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                self._spawn(self._submit(key, track))
            if not self.tracks:
                self._done.set()
            await asyncio.wait_for(self._done.wait(), timeout=timeout_s)
            while self._pending_calls:
                await asyncio.gather(*list(self._pending_calls), return_exceptions=True)
            # the endings' events are this run's too: read them before the checks use the log
            await asyncio.sleep(0)
            await reader.catch_up()
        finally:
            stopping.set()
            for track in self.tracks.values():
                if track.release is not None:
                    track.release.cancel()
            with contextlib.suppress(Exception):  # teardown: what `_open` made may be gone already
                await self._close()
            for background in (follower, idle_task, commands_task, stalls_task):
                if background is not None:
                    background.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await background
            await reader.stop()
            await idle_reader.stop()
            if commands is not None:
                await commands.stop()
            if checkpoints_channel is not None:
                await checkpoints_channel.close()
            await channel.close()
        return self.outcomes()

    def outcomes(self) -> list[Outcome]:
        result = []
        for key, track in self.tracks.items():
            if track.bound_wall is None or track.ended_wall is None:
                continue
            result.append(
                Outcome(
                    key,
                    track.job.queue,
                    track.job.gpus,
                    self.trace_s(track.submitted_wall),
                    self.trace_s(track.bound_wall),
                    self.trace_s(track.ended_wall),
                    track.job.idle,
                    runs=track.runs,
                    lost_gpu_s=track.lost_gpu_s,
                    holds=tuple((self.trace_s(start), self.trace_s(end)) for start, end in track.holds),
                    found_idle=len(track.found_idle),
                    reclaimed=track.reclaimed,
                    found_after_s=tuple(wall * self.speed for wall in track.found_after_wall),
                    reclaimed_after_s=tuple(wall * self.speed for wall in track.reclaimed_after_wall),
                )
            )
        return result
