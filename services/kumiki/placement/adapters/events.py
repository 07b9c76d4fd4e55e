"""Publishing placement's decisions (before any answer leaves) and rebuilding the book from them."""

from __future__ import annotations

import asyncio
import logging
import uuid

from kumiki.common.bus import Event, EventProducer
from kumiki.common.bus.producer import OutgoingEvent
from kumiki.common.bus.replay import TopicReader
from kumiki.common.bus.topics import CLUSTER_STATE, JOB_LIFECYCLE, SCHEDULING_DECISIONS
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.grpcutil import timestamp
from kumiki.placement.adapters.convert import (
    InvalidNodeState,
    assignments,
    lifecycle,
    node_healthy,
    node_spec,
    pending_reason,
    restore_from_lifecycle,
)
from kumiki.placement.core import BindCommand, BoundJob, PlacementBook
from kumiki.sched.placement import PendingReason

log = logging.getLogger(__name__)

RELEASING_STATES = {
    events_pb2.JOB_STATE_RELEASED,
    events_pb2.JOB_STATE_COMPLETED,
    events_pb2.JOB_STATE_FAILED,
    events_pb2.JOB_STATE_PREEMPTED,
}


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
        await self._publish_pair(job, lifecycle(job, events_pb2.JOB_STATE_BOUND, placed=placed), "bound", decision)
        return decision

    async def _publish_pair(
        self, job: BoundJob, change: events_pb2.JobLifecycle, verb: str, decision: events_pb2.SchedulingDecision
    ) -> None:
        """The allocation change and the decision that explains it, acknowledged together."""
        key = job.command.job_id
        await self.producer.publish_records(
            [
                OutgoingEvent(JOB_LIFECYCLE, key, change, f"{key}/{job.command.generation}/{verb}"),
                OutgoingEvent(SCHEDULING_DECISIONS, key, decision, decision.decision_id),
            ]
        )

    async def pending(self, command: BindCommand, reason: PendingReason) -> str:
        decision = self._decision(events_pb2.DECISION_KIND_PENDING, command)
        decision.reasons.append(pending_reason(reason))
        await self.producer.publish(SCHEDULING_DECISIONS, command.job_id, decision, event_id=decision.decision_id)
        return decision.decision_id

    async def released(self, job: BoundJob, reason: str) -> str:
        decision = self._decision(events_pb2.DECISION_KIND_RELEASE, job.command)
        decision.reasons.append(common_pb2.PendingReason(code="released", message=reason))
        await self._publish_pair(job, lifecycle(job, events_pb2.JOB_STATE_RELEASED, reason), "released", decision)
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
        displaced = self.book.upsert_node(spec, node_healthy(state))
        for job in displaced:
            log.warning("allocation no longer fits its changed node", extra={"job": job.command.job_id})
            if self.publisher is not None:
                await self.publisher.released(
                    job, f"node {','.join(set(job.node_names))} changed; allocation no longer fits"
                )
        self.on_change.set()


class AllocationLog:
    """job.lifecycle → the book's allocations (rebuild after a restart).

    Events of one job are ordered (one key, one partition) but events of different jobs are not: a job bound
    into GPUs that another job released may be read before that release. So the log first settles each job's
    last word, and only the allocations still held at the end, which never overlap, go into the book.
    """

    def __init__(self, book: PlacementBook) -> None:
        self.book = book
        self.latest: dict[str, events_pb2.JobLifecycle] = {}

    async def __call__(self, key: str, event: Event | None) -> None:
        if event is None:
            return
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        if message.state != events_pb2.JOB_STATE_BOUND and message.state not in RELEASING_STATES:
            return
        current = self.latest.get(message.job.job_id)
        if current is None or message.job.generation >= current.job.generation:
            self.latest[message.job.job_id] = message

    def apply(self) -> int:
        """Restore every job whose last event is BOUND; returns how many."""
        restored = 0
        for message in self.latest.values():
            if message.state == events_pb2.JOB_STATE_BOUND:
                command, pods = restore_from_lifecycle(message)
                self.book.forget(command.job_id)
                self.book.restore(command, pods)
                restored += 1
        return restored


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
    log_of_allocations.apply()
    problems = book.audit()
    if problems:
        raise RuntimeError(f"rebuilt allocation table is inconsistent: {problems[:5]}")
    log.info("placement rebuilt", extra={"nodes": len(book.nodes), "bound": len(book.bound), "events": replayed})
    return nodes, replayed
