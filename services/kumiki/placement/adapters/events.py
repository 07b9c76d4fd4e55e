"""Publishing placement's decisions (before any answer leaves) and rebuilding the book from them."""

from __future__ import annotations

import asyncio
import logging
import uuid

from kumiki.common.bus import Event, EventProducer
from kumiki.common.bus.producer import OutgoingEvent
from kumiki.common.bus.replay import TopicReader
from kumiki.common.bus.topics import (
    CHECKPOINTS,
    CLUSTER_STATE,
    GPU_BUSY,
    GPU_IDLE,
    JOB_FORECAST,
    JOB_LIFECYCLE,
    SCHEDULING_DECISIONS,
)
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import checkpoints_pb2, common_pb2, events_pb2
from kumiki.common.grpcutil import InvalidRequest, timestamp, unix_seconds
from kumiki.common.node_state import takes_work
from kumiki.placement.adapters.convert import (
    InvalidNodeState,
    assignments,
    command_from_lifecycle,
    command_lifecycle,
    lifecycle,
    node_spec,
    pending_reason,
    restore_from_lifecycle,
    runtime_forecast,
)
from kumiki.placement.core import BindCommand, BoundJob, PlacementBook, Victim
from kumiki.sched.idle import IDLE_RECLAIM
from kumiki.sched.jobs import RequestError
from kumiki.sched.placement import PendingReason

log = logging.getLogger(__name__)

RELEASING_STATES = {
    events_pb2.JOB_STATE_RELEASED,
    events_pb2.JOB_STATE_COMPLETED,
    events_pb2.JOB_STATE_FAILED,
    events_pb2.JOB_STATE_PREEMPTED,
}


PLACEMENT_SOURCE = "//kumiki/placement/"  # ce_source of what placement publishes (kumiki.common.service)
TRACKED_STATES = {events_pb2.JOB_STATE_SUBMITTED, events_pb2.JOB_STATE_BOUND, *RELEASING_STATES}


def preempted_reason(cause: str) -> str:
    """A PREEMPTED event's reason: why the victim was chosen (a preemption reason such as "idle-reclaim"), which a
    restarted placement reads back (an idle-reclaimed job waits behind the jobs that compute)."""
    return f"preempted ({cause})" if cause else "preempted"


class DecisionPublisher:
    """Every bind and release goes to job.lifecycle (the log the table is rebuilt from) and to
    scheduling.decisions (with its reason, for other systems) and is acknowledged before the caller hears."""

    def __init__(self, producer: EventProducer, policy: str) -> None:
        self.producer = producer
        self.policy = policy

    def _decision(self, kind: int, command: BindCommand) -> events_pb2.SchedulingDecision:
        return events_pb2.SchedulingDecision(
            decision_id=str(uuid.uuid4()),
            kind=kind,  # type: ignore[arg-type]
            job=common_pb2.JobRef(job_id=command.job_id, generation=command.generation),
            queue=command.queue,
            policy=self.policy,
            at=timestamp(),
        )

    async def bound(self, job: BoundJob, kind: int = events_pb2.DECISION_KIND_BIND) -> events_pb2.SchedulingDecision:
        """Publish a bind; the decision returned carries the assignments the caller answers with."""
        placed = assignments(job)
        decision = self._decision(kind, job.command)
        decision.assignments.extend(placed)
        change = lifecycle(job, events_pb2.JOB_STATE_BOUND, placed=placed)
        await self._publish_pair(job.command, change, "bound", decision)
        return decision

    async def _publish_pair(
        self, command: BindCommand, change: events_pb2.JobLifecycle, verb: str, decision: events_pb2.SchedulingDecision
    ) -> None:
        """The lifecycle change and the decision that explains it, acknowledged together."""
        key = command.job_id
        await self.producer.publish_records(
            [
                OutgoingEvent(JOB_LIFECYCLE, key, change, f"{key}/{command.generation}/{verb}"),
                OutgoingEvent(SCHEDULING_DECISIONS, key, decision, decision.decision_id),
            ]
        )

    async def pending(self, command: BindCommand, reason: PendingReason, submitted_s: float | None = None) -> str:
        """`submitted_s`: the job has just joined the queue, so its SUBMITTED event (the whole request and its
        arrival time, what a restarted placement re-queues it from) goes out with the decision."""
        decision = self._decision(events_pb2.DECISION_KIND_PENDING, command)
        decision.reasons.append(pending_reason(reason))
        if submitted_s is None:
            await self.producer.publish(SCHEDULING_DECISIONS, command.job_id, decision, event_id=decision.decision_id)
        else:
            change = command_lifecycle(command, events_pb2.JOB_STATE_SUBMITTED, at_s=submitted_s)
            await self._publish_pair(command, change, "submitted", decision)
        return decision.decision_id

    async def released(
        self, job: BoundJob, reason: str, state: int = events_pb2.JOB_STATE_RELEASED, runtime_s: float = 0.0
    ) -> str:
        """`state`: RELEASED, or how the job ended (COMPLETED, FAILED) with its run time since the bind."""
        decision = self._decision(events_pb2.DECISION_KIND_RELEASE, job.command)
        decision.reasons.append(common_pb2.PendingReason(code="released", message=reason))
        change = lifecycle(job, state, reason, runtime_s=runtime_s)
        await self._publish_pair(job.command, change, "released", decision)
        return decision.decision_id

    async def preempted(self, victim: Victim) -> str:
        """A PREEMPT decision naming the victim, its pods, the beneficiary, the reason and the unsaved work: the
        preemption coordinator runs the checkpoint protocol from it."""
        job, preemption = victim.job, victim.preemption
        decision = self._decision(events_pb2.DECISION_KIND_PREEMPT, job.command)
        if victim.decided_s:  # the moment the unsaved work was measured, not the (later) moment of publishing
            decision.at.FromNanoseconds(int(victim.decided_s * 1e9))
        decision.assignments.extend(assignments(job))
        reason = "reservation" if preemption.reason == "reservation deadline" else preemption.reason
        decision.preemption_reason = reason
        decision.lost_gpu_seconds = preemption.lost_gpu_s
        decision.since_checkpoint_s = preemption.since_checkpoint_s
        decision.beneficiary.job_id = preemption.for_job
        decision.beneficiary.generation = 0
        decision.reasons.append(
            common_pb2.PendingReason(
                code=reason,
                message=f"preempted for {preemption.for_job} ({preemption.reason}); "
                f"{preemption.since_checkpoint_s:.0f} s unsaved, {preemption.lost_gpu_s:.0f} GPU-s",
            )
        )
        await self.producer.publish(SCHEDULING_DECISIONS, job.command.job_id, decision, event_id=decision.decision_id)
        return decision.decision_id

    async def requeued(
        self, job: BoundJob, again: BindCommand, lost_gpu_seconds: float, runtime_s: float, cause: str = ""
    ) -> None:
        """An evicted attempt: PREEMPTED (with its lost work, what quota's ledger records, and why it was chosen,
        `cause`) and the next generation's SUBMITTED (what a restarted placement re-queues), acknowledged together."""
        change = lifecycle(job, events_pb2.JOB_STATE_PREEMPTED, preempted_reason(cause), runtime_s=runtime_s)
        change.lost_gpu_seconds = lost_gpu_seconds
        submitted = command_lifecycle(again, events_pb2.JOB_STATE_SUBMITTED, "requeued after preemption", job.arrived_s)
        decision = self._decision(events_pb2.DECISION_KIND_RELEASE, job.command)
        decision.reasons.append(common_pb2.PendingReason(code="preempted", message="evicted; queued again"))
        key = job.command.job_id
        await self.producer.publish_records(
            [
                OutgoingEvent(JOB_LIFECYCLE, key, change, f"{key}/{job.command.generation}/preempted"),
                OutgoingEvent(JOB_LIFECYCLE, key, submitted, f"{key}/{again.generation}/submitted"),
                OutgoingEvent(SCHEDULING_DECISIONS, key, decision, decision.decision_id),
            ]
        )

    async def withdrawn(self, command: BindCommand, reason: str) -> str:
        """A waiting job left the queue unplaced: RELEASED without assignments, so a restart does not re-queue it."""
        decision = self._decision(events_pb2.DECISION_KIND_RELEASE, command)
        decision.reasons.append(common_pb2.PendingReason(code="withdrawn", message=reason))
        change = command_lifecycle(command, events_pb2.JOB_STATE_RELEASED, reason)
        await self._publish_pair(command, change, "withdrawn", decision)
        return decision.decision_id


class NodeTable:
    """cluster.state → the book's nodes. Bad records are skipped with a warning (telemetry validates them)."""

    def __init__(self, book: PlacementBook, on_change: asyncio.Event, publisher: DecisionPublisher | None = None):
        self.book = book
        self.on_change = on_change
        self.publisher = publisher
        self.rejected = 0

    async def __call__(self, key: str, event: Event | None) -> None:
        if event is None:
            self.book.remove_node(key)
            self.on_change.set()
            return
        state = event.payload
        assert isinstance(state, events_pb2.NodeState)
        try:
            spec = node_spec(state)
        except InvalidNodeState as error:
            self.rejected += 1
            log.warning("ignored node state", extra={"node": state.node, "reason": str(error)})
            return
        displaced = self.book.upsert_node(spec, takes_work(state))
        for job in displaced:
            log.warning("allocation no longer fits its changed node", extra={"job": job.command.job_id})
            if self.publisher is not None:
                await self.publisher.released(
                    job, f"node {','.join(set(job.node_names))} changed; allocation no longer fits"
                )
        self.on_change.set()


class AllocationLog:
    """job.lifecycle → the book's allocations and waiting jobs (rebuild after a restart).

    Events of one job are ordered (one key, one partition) but events of different jobs are not: a job bound
    into GPUs that another job released may be read before that release. So the log first settles each job's
    last word, and only the allocations still held at the end, which never overlap, go into the book; jobs
    whose last word is SUBMITTED were waiting, and wait again in their arrival order, their wait counted from
    that SUBMITTED's publication (a requeued attempt's: its eviction; its `at` is the job's arrival). A job
    that has not ended gets back its service so far from its PREEMPTED attempts (run time, lost work).
    """

    def __init__(self, book: PlacementBook) -> None:
        self.book = book
        self.latest: dict[str, events_pb2.JobLifecycle] = {}
        self.published_s: dict[str, float] = {}  # job -> when its latest event was published (CloudEvent time)
        # job -> generation -> (run time, GPUs, lost GPU-seconds, evicted by idle reclaim) of each evicted attempt
        self.evicted: dict[str, dict[int, tuple[float, float, float, bool]]] = {}
        self.skipped = 0

    async def __call__(self, key: str, event: Event | None) -> None:
        if event is None:
            return
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        if message.state not in TRACKED_STATES:
            return
        if message.state == events_pb2.JOB_STATE_SUBMITTED and not event.attributes.source.startswith(PLACEMENT_SOURCE):
            return  # another system announcing a job: placement queues only what it was asked to place
        if message.state == events_pb2.JOB_STATE_PREEMPTED and message.runtime_s >= 0:
            idle_reclaim = message.reason == preempted_reason(IDLE_RECLAIM)
            attempt = (message.runtime_s, message.gpus, max(0.0, message.lost_gpu_seconds), idle_reclaim)
            self.evicted.setdefault(message.job.job_id, {})[message.job.generation] = attempt
        current = self.latest.get(message.job.job_id)
        if current is None or message.job.generation >= current.job.generation:
            self.latest[message.job.job_id] = message
            self.published_s[message.job.job_id] = event.attributes.time.timestamp()

    def apply(self) -> tuple[int, int]:
        """Restore every job whose last event is BOUND, then re-queue those whose last event is SUBMITTED;
        returns how many of each."""
        for job_id, attempts in self.evicted.items():  # first: the restored views carry it
            latest = self.latest[job_id]
            if latest.state in (events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED):
                continue
            service = self.book.served_so_far(job_id)  # busy reports were read before (follow_tables)
            for generation in sorted(attempts):
                if generation < latest.job.generation:
                    service = service.after_eviction(*attempts[generation], generation=generation)
            if service.preemptions:
                self.book.served[job_id] = service
        restored = 0
        waiting = []
        for message in self.latest.values():
            try:
                if message.state == events_pb2.JOB_STATE_BOUND:
                    command, pods = restore_from_lifecycle(message)
                    self.book.forget(command.job_id)
                    self.book.restore(command, pods, message.at.ToNanoseconds() / 1e9)
                    restored += 1
                elif message.state == events_pb2.JOB_STATE_SUBMITTED:
                    arrived_s = message.at.ToNanoseconds() / 1e9
                    queued_s = max(arrived_s, self.published_s[message.job.job_id])
                    waiting.append((arrived_s, queued_s, command_from_lifecycle(message)))
                elif message.state in (events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED):
                    self.book.mark_ended(message.job.job_id, message.job.generation)
            except (InvalidRequest, RequestError, ValueError) as error:  # a record no bind could have written
                self.skipped += 1
                log.warning("lifecycle event not restored", extra={"job": message.job.job_id, "reason": str(error)})
        for submitted_s, queued_s, command in sorted(waiting, key=lambda item: item[:2]):
            self.book.restore_pending(command, submitted_s, queued_s)
        return restored, len(waiting)


class CheckpointTable:
    """kumiki.checkpoints → the book's newest acknowledged checkpoint per job (victim choice)."""

    def __init__(self, book: PlacementBook) -> None:
        self.book = book

    async def __call__(self, key: str, event: Event | None) -> None:
        if event is None:
            return
        report = event.payload
        assert isinstance(report, checkpoints_pb2.CheckpointReport)
        completed = unix_seconds(report.completed_at)
        if report.job.job_id and completed > 0:
            self.book.checkpointed(report.job.job_id, completed)


class ForecastTable:
    """kumiki.job.forecast → the book's forecast per job (the `kumiki` policy orders and backfills by it)."""

    def __init__(self, book: PlacementBook) -> None:
        self.book = book

    async def __call__(self, key: str, event: Event | None) -> None:
        if event is None:
            return
        message = event.payload
        assert isinstance(message, events_pb2.RuntimeForecast)
        try:
            forecast = runtime_forecast(message)
        except InvalidRequest as error:  # a producer's bug must not order the queue: the job keeps no forecast
            log.warning("forecast ignored", extra={"job": message.job.job_id, "reason": str(error)})
            return
        self.book.forecast(message.job.job_id, forecast)


class GpuUseTable:
    """kumiki.gpu.idle and kumiki.gpu.busy → the book: idle windows per job (idle reclaim, by the job's queue's rule),
    dropped when the job is found computing again, which also lifts an idle-reclaimed job's demotion."""

    def __init__(self, book: PlacementBook) -> None:
        self.book = book

    async def __call__(self, key: str, event: Event | None) -> None:
        if event is None:
            return
        found = event.payload
        assert isinstance(found, events_pb2.GpuIdle | events_pb2.GpuBusy)
        since = unix_seconds(found.since)
        until = unix_seconds(found.until)
        if not until >= since > 0:
            return
        if isinstance(found, events_pb2.GpuIdle):
            self.book.gpu_idle(found.job.job_id, found.job.generation, since, until)
        else:
            self.book.gpu_busy(found.job.job_id, found.job.generation, until)


async def follow_tables(settings: KafkaSettings, book: PlacementBook) -> list[TopicReader]:
    """Checkpoints, forecasts, idle and busy reports read to their end (before serving), then followed by the
    caller."""
    readers = [
        TopicReader(settings, CHECKPOINTS, CheckpointTable(book)),
        TopicReader(settings, JOB_FORECAST, ForecastTable(book)),
        TopicReader(settings, GPU_IDLE, GpuUseTable(book)),
        TopicReader(settings, GPU_BUSY, GpuUseTable(book)),
    ]
    for reader in readers:
        await reader.start()
        await reader.catch_up()
    return readers


async def rebuild(settings: KafkaSettings, book: PlacementBook, on_change: asyncio.Event) -> tuple[TopicReader, int]:
    """Nodes from cluster.state, then allocations from job.lifecycle; returns the node reader to follow."""
    nodes = TopicReader(settings, CLUSTER_STATE, NodeTable(book, on_change))
    await nodes.start()
    await nodes.catch_up()
    log_of_allocations = AllocationLog(book)
    allocations = TopicReader(settings, JOB_LIFECYCLE, log_of_allocations)
    await allocations.start()
    try:
        replayed = await allocations.catch_up()
    finally:
        await allocations.stop()
    _, waiting = log_of_allocations.apply()
    problems = book.audit()
    if problems:
        raise RuntimeError(f"rebuilt allocation table is inconsistent: {problems[:5]}")
    log.info(
        "placement rebuilt",
        extra={"nodes": len(book.nodes), "bound": len(book.bound), "waiting": waiting, "events": replayed},
    )
    if waiting:
        on_change.set()  # the first cycle asks admission for them again and places what fits
    return nodes, replayed
