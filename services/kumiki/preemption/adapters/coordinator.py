"""The coordinator's shell: decisions and lifecycle events in, commands and releases out, all through Postgres.

Inputs (each applied in one transaction with the protocol row and its outbox rows):
- kumiki.scheduling.decisions (PREEMPT, RECLAIM): a protocol begins with CHECKPOINT;
- Checkpoints.Report: a checkpoint after CHECKPOINT acknowledges it, and EVICT follows at once;
- the clock: a CHECKPOINT past its deadline is evicted anyway (lost work recorded);
- kumiki.job.lifecycle: PREEMPTED confirms the release, BOUND of a later generation gets RESUME, an attempt that
  ends on its own closes its protocol.
The outbox loop carries out the effects at least once: commands go to kumiki.preemption.commands (the binder
evicts on EVICT) and to the Watch streams (the SDK), releases to Placement.Release(JOB_STATE_PREEMPTED).

A preemption is one trace: every transition that issues a command is a `<action> command` span, a child of
the step that caused it (the decision's consumer span, the job's Report, the rebind's lifecycle event, or, at
the deadline, the previous command's), and its W3C traceparent is stored with the protocol and the outbox
rows, so carrying them out (also after a restart) continues that trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime

import asyncpg
import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from kumiki.common.bus import Event, EventProducer, EventRejected
from kumiki.common.bus.topics import CHECKPOINTS, PREEMPTION_COMMANDS
from kumiki.common.contracts.v1 import checkpoints_pb2, common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.grpcutil import client_channel, timestamp, unix_seconds
from kumiki.common.tracing import ClientTracingInterceptor, context_from_traceparent, current_traceparent
from kumiki.preemption import core
from kumiki.preemption.adapters import store
from kumiki.preemption.adapters.registry import latest_in, record_in

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.preemption")

PREEMPTIONS = Counter("kumiki_preemption_preemptions_total", "Preemption protocols begun, by reason", ["reason"])
ACK_SECONDS = Histogram(
    "kumiki_preemption_checkpoint_ack_seconds",
    "CHECKPOINT issued to the job's acknowledging checkpoint report",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)
DEADLINE_MISSES = Counter(
    "kumiki_preemption_deadline_misses_total", "Jobs evicted at the deadline without an acknowledgement", ["queue"]
)
LOST_GPU_HOURS = Counter(
    "kumiki_preemption_lost_gpu_hours_total", "Work lost by evicted jobs since their last checkpoint", ["queue"]
)
EVICTIONS = Counter("kumiki_preemption_evictions_total", "Evictions, by whether the deadline forced them", ["forced"])
HELD = Counter("kumiki_preemption_held_total", "Decisions read before their attempt's BOUND, held until it is seen")
HELD_DROPPED = Counter(
    "kumiki_preemption_held_dropped_total", "Held decisions dropped: their attempt was not bound within the hold"
)
# an ended attempt is remembered this long (a late decision for it is told apart from an early one)
ENDED_KEPT_S = 3600.0

ACTION_TO_WIRE = {
    core.Action.CHECKPOINT: events_pb2.PREEMPTION_ACTION_CHECKPOINT,
    core.Action.EVICT: events_pb2.PREEMPTION_ACTION_EVICT,
    core.Action.RESUME: events_pb2.PREEMPTION_ACTION_RESUME,
}
PREEMPTING_KINDS = {events_pb2.DECISION_KIND_PREEMPT, events_pb2.DECISION_KIND_RECLAIM}
ENDING_STATES = {events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED, events_pb2.JOB_STATE_RELEASED}


def _stamp(unix_s: float) -> Timestamp:
    return timestamp(datetime.fromtimestamp(unix_s, UTC))


def assignment_gpus(assignments: list[common_pb2.PodAssignment]) -> float:
    """GPUs held by these pods: whole GPUs count 1 each, a fraction its share, a MIG slice its compute share."""
    total = 0.0
    for pod in assignments:
        if pod.gpu_fraction:
            total += pod.gpu_fraction
        elif pod.mig_slice:
            total += int(pod.mig_slice.split("g.", 1)[0]) / 7.0
        else:
            total += len(pod.gpu_indices)
    return total


async def _attempt(connection: asyncpg.Connection, job_id: str, generation: int) -> asyncpg.Record | None:
    """The bound attempt as job.lifecycle announced it (None: its BOUND not read yet, or long forgotten)."""
    row: asyncpg.Record | None = await connection.fetchrow(
        "SELECT gpus, bound_unix_s, assignments, ended_unix_s FROM preemption.attempts"
        " WHERE job_id = $1 AND generation = $2",
        job_id,
        generation,
    )
    return row


def request_from_decision(decision: events_pb2.SchedulingDecision) -> core.PreemptRequest:
    """A PREEMPT / RECLAIM decision in core terms; EventRejected names a bad field."""
    at_s = unix_seconds(decision.at) if decision.HasField("at") else time.time()
    request = core.PreemptRequest(
        job_id=decision.job.job_id,
        generation=decision.job.generation,
        queue=decision.queue,
        gpus=assignment_gpus(list(decision.assignments)),
        reason=decision.preemption_reason
        or ("quota-reclaim" if decision.kind == events_pb2.DECISION_KIND_RECLAIM else "other"),
        decision_id=decision.decision_id,
        bound_unix_s=at_s - max(0.0, decision.since_checkpoint_s),
        beneficiary=decision.beneficiary.job_id,
        beneficiary_generation=decision.beneficiary.generation,
    )
    problems = core.validate_request(request)
    if problems:
        raise EventRejected("; ".join(f"{field}: {problem}" for field, problem in problems))
    return request


@contextlib.contextmanager
def step(transition: core.Transition | None, stored_traceparent: str = "") -> Iterator[str]:
    """The span of a transition that issues a command (`checkpoint command`, `evict command`, `resume
    command`), a child of the current span or, with none (the deadline's clock, a restarted process), of the
    protocol's stored step. Yields the traceparent to store with the transition ('' when none travels)."""
    commands = [] if transition is None else [e for e in transition.effects if isinstance(e, core.Command)]
    current = trace.get_current_span().get_span_context().is_valid
    parent = None if current else context_from_traceparent(stored_traceparent)
    if not commands or transition is None or not transition.changed:
        yield ""  # no command: the protocol keeps its step, and there is no effect to carry it
        return
    protocol = transition.protocol
    command = commands[0]
    attributes: dict[str, str | int | float | bool] = {
        "kumiki.job.id": protocol.job_id,
        "kumiki.job.generation": command.generation,
        "kumiki.preemption.action": command.action.value,
        "kumiki.preemption.command_id": command.command_id,
        "kumiki.preemption.reason": protocol.reason,
        "kumiki.preemption.decision_id": protocol.decision_id,
        "kumiki.queue": protocol.queue,
    }
    if protocol.beneficiary:
        attributes["kumiki.preemption.beneficiary"] = protocol.beneficiary
    if command.action is core.Action.EVICT:
        attributes["kumiki.preemption.forced"] = protocol.forced
        attributes["kumiki.preemption.lost_gpu_seconds"] = protocol.lost_gpu_seconds
    with tracer.start_as_current_span(f"{command.action.value} command", context=parent, attributes=attributes):
        yield current_traceparent()


@contextlib.contextmanager
def continuing(traceparent: str) -> Iterator[None]:
    """Carry out an outbox row inside the trace of the step that queued it (nothing when none was stored)."""
    if not traceparent:
        yield
        return
    token = otel_context.attach(context_from_traceparent(traceparent))
    try:
        yield
    finally:
        otel_context.detach(token)


class Coordinator:
    def __init__(
        self,
        pool: asyncpg.Pool,
        producer: EventProducer,
        *,
        placement_address: str | None,
        deadline_s: float,
        grace_period_s: float = 30.0,
        hold_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.producer = producer
        self.placement_address = placement_address
        self.deadline_s = deadline_s
        self.hold_s = hold_s  # how long a decision read before its attempt's BOUND waits for it
        self.grace_period_s = grace_period_s
        self.clock = clock
        self.work = asyncio.Event()
        self._changed = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._warned_no_placement = False

    # ---- change notification (Watch streams re-read the database when woken, and at least every second) ----
    def _notify(self) -> None:
        self.work.set()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _record(self, before: core.Protocol | None, transition: core.Transition) -> None:
        """Metrics of a transition just saved."""
        after = transition.protocol
        if before is None:
            labelled_inc(PREEMPTIONS, after.reason)
        if after.phase is core.Phase.EVICTING and (before is None or before.phase is core.Phase.CHECKPOINTING):
            EVICTIONS.labels(str(after.forced).lower()).inc()
            LOST_GPU_HOURS.labels(after.queue).inc(after.lost_gpu_seconds / 3600.0)
            if after.forced:
                DEADLINE_MISSES.labels(after.queue).inc()
            else:
                ACK_SECONDS.observe(max(0.0, after.acked_unix_s - after.requested_unix_s))

    # ---- inputs ----------------------------------------------------------------------------------------------
    async def on_decision(self, event: Event, connection: asyncpg.Connection | None) -> None:
        decision = event.payload
        assert isinstance(decision, events_pb2.SchedulingDecision) and connection is not None
        if decision.kind not in PREEMPTING_KINDS:
            return
        if not decision.assignments:  # quota's RECLAIM names the job only: the bound attempt supplies the rest
            row = await _attempt(connection, decision.job.job_id, decision.job.generation)
            if row is None:  # read before the attempt's BOUND (another topic): held until it is seen
                await self._hold(connection, decision)
                return
            if row["ended_unix_s"] is not None:
                log.info("preemption of an attempt that already ended; ignored", extra={"job": decision.job.job_id})
                return
            decision = self._with_attempt(decision, row)
        await self._begin(connection, decision)

    def _with_attempt(
        self, decision: events_pb2.SchedulingDecision, row: asyncpg.Record
    ) -> events_pb2.SchedulingDecision:
        """A decision that names the job only, completed from its bound attempt (pods, GPUs, unsaved work)."""
        decision = events_pb2.SchedulingDecision.FromString(decision.SerializeToString())
        decision.assignments.extend(events_pb2.PreemptionCommand.FromString(bytes(row["assignments"])).assignments)
        at_s = unix_seconds(decision.at) if decision.HasField("at") else self.clock()
        decision.since_checkpoint_s = max(0.0, at_s - row["bound_unix_s"])
        if decision.kind == events_pb2.DECISION_KIND_RECLAIM and not decision.preemption_reason:
            decision.preemption_reason = "quota-reclaim"
        return decision

    async def _hold(self, connection: asyncpg.Connection, decision: events_pb2.SchedulingDecision) -> None:
        """Keep a decision whose attempt's BOUND has not been read yet (in the consumer's transaction: a crash
        keeps it too); the bind begins it, the hold deadline drops it."""
        request_from_decision(decision)  # a malformed decision is rejected now, not held
        now = self.clock()
        held = await connection.execute(
            "INSERT INTO preemption.held_decisions (job_id, generation, decision, held_unix_s, deadline_unix_s)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id, generation) DO NOTHING",
            decision.job.job_id,
            decision.job.generation,
            decision.SerializeToString(),
            now,
            now + self.hold_s,
        )
        if held.endswith(" 1"):
            HELD.inc()
            log.info("preemption held until its attempt's bind is seen", extra={"job": decision.job.job_id})

    async def _begin(self, connection: asyncpg.Connection, decision: events_pb2.SchedulingDecision) -> None:
        """The protocol of a complete decision begins (CHECKPOINT); a repeated one changes nothing."""
        request = request_from_decision(decision)
        existing = await store.load(connection, request.job_id, request.generation, lock=True)
        transition = core.begin(existing.protocol if existing else None, request, self.clock(), self.deadline_s)
        if transition is None:
            return
        kept = events_pb2.PreemptionCommand(assignments=list(decision.assignments)).SerializeToString()
        with step(transition) as traceparent:
            await store.save(connection, transition, kept, traceparent)
        self._record(None, transition)
        self._notify_after_commit()

    async def on_lifecycle(self, event: Event, connection: asyncpg.Connection | None) -> None:
        change = event.payload
        assert isinstance(change, events_pb2.JobLifecycle) and connection is not None
        state = change.state
        if state == events_pb2.JOB_STATE_BOUND:
            await connection.execute(
                "INSERT INTO preemption.attempts (job_id, generation, gpus, bound_unix_s, assignments)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (job_id, generation) DO NOTHING",
                change.job.job_id,
                change.job.generation,
                assignment_gpus(list(change.assignments)),
                unix_seconds(change.at) if change.HasField("at") else self.clock(),
                events_pb2.PreemptionCommand(assignments=list(change.assignments)).SerializeToString(),
            )
            held = await connection.fetchval(
                "DELETE FROM preemption.held_decisions WHERE job_id = $1 AND generation = $2 RETURNING decision",
                change.job.job_id,
                change.job.generation,
            )
            row = None if held is None else await _attempt(connection, change.job.job_id, change.job.generation)
            if held is not None and row is not None:  # a decision read before this bind: it begins now
                decision = events_pb2.SchedulingDecision.FromString(bytes(held))
                await self._begin(connection, self._with_attempt(decision, row))
        elif state in ENDING_STATES or state == events_pb2.JOB_STATE_PREEMPTED:
            await connection.execute(
                "UPDATE preemption.attempts SET ended_unix_s = $3 WHERE job_id = $1 AND generation = $2",
                change.job.job_id,
                change.job.generation,
                self.clock(),
            )
            await connection.execute(
                "DELETE FROM preemption.held_decisions WHERE job_id = $1 AND generation = $2",
                change.job.job_id,
                change.job.generation,
            )
        if state not in ENDING_STATES and state not in (events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_PREEMPTED):
            return
        for stored in await store.open_for_job(connection, change.job.job_id, lock=True):
            protocol = stored.protocol
            if state == events_pb2.JOB_STATE_BOUND:
                transition = core.rebound(protocol, change.job.generation)
            elif state == events_pb2.JOB_STATE_PREEMPTED and change.job.generation == protocol.generation:
                transition = core.released(protocol)
            else:
                transition = core.ended(protocol, change.job.generation)
            with step(transition, stored.traceparent) as traceparent:
                await store.save(connection, transition, stored.assignments, traceparent)
            if transition.changed:
                self._notify_after_commit()

    async def expire_held(self) -> int:
        """Drop held decisions whose attempt's bind was not seen by their hold deadline, and forget attempts that
        ended long ago; returns the decisions dropped."""
        now = self.clock()
        async with self.pool.acquire() as connection, connection.transaction():
            dropped = await connection.fetch(
                "DELETE FROM preemption.held_decisions WHERE deadline_unix_s <= $1 RETURNING job_id, generation", now
            )
            await connection.execute(
                "DELETE FROM preemption.attempts WHERE ended_unix_s < $1", now - max(ENDED_KEPT_S, self.hold_s)
            )
        for row in dropped:
            HELD_DROPPED.inc()
            log.warning(
                "preemption dropped: its attempt was not bound within the hold",
                extra={"job": row["job_id"], "generation": row["generation"], "hold_s": self.hold_s},
            )
        return len(dropped)

    def _notify_after_commit(self) -> None:
        """Consumer handlers run inside the batch's transaction: wake readers once it has had time to commit
        (they re-read every second anyway)."""
        asyncio.get_running_loop().call_later(0.05, self._notify)

    async def report(
        self, record: core.CheckpointRecord, message: checkpoints_pb2.CheckpointReport
    ) -> core.CheckpointRecord:
        """Record a checkpoint; one written after CHECKPOINT acknowledges it (EVICT follows). Returns the latest."""
        now = self.clock()
        async with self.pool.acquire() as connection, connection.transaction():
            latest = await record_in(connection, record)
            if latest != record:
                return latest
            await store.add_checkpoint_event(
                connection, record.job_id, record.generation, message.SerializeToString(), current_traceparent()
            )
            for stored in await store.open_for_job(connection, record.job_id, lock=True):
                transition = core.acknowledge(stored.protocol, record, now)
                with step(transition, stored.traceparent) as traceparent:
                    await store.save(connection, transition, stored.assignments, traceparent)
                if transition.changed:
                    self._record(stored.protocol, transition)
        self._notify()
        return latest

    async def expire_due(self) -> int:
        """Evict every protocol whose deadline passed without an acknowledgement."""
        now = self.clock()
        async with self.pool.acquire() as connection, connection.transaction():
            due = await store.expired(connection, now)
            for stored in due:
                latest = await latest_in(connection, stored.protocol.job_id)
                transition = core.expire(stored.protocol, latest, now)
                with step(transition, stored.traceparent) as traceparent:
                    await store.save(connection, transition, stored.assignments, traceparent)
                if transition.changed:
                    self._record(stored.protocol, transition)
        if due:
            self._notify()
        return len(due)

    # ---- effects ---------------------------------------------------------------------------------------------
    async def render(self, item: store.OutboxItem) -> events_pb2.PreemptionCommand | None:
        stored = await store.load(self.pool, item.job_id, item.generation)
        if stored is None:
            return None
        command = render(stored, core.Action(item.action), self.grace_period_s)
        command.traceparent = item.traceparent or command.traceparent  # the step that issued this one
        return command

    async def carry_out(self) -> int:
        """Every effect not yet done, in order; one that fails is retried on the next round."""
        done = 0
        for item in await store.pending_effects(self.pool):
            try:
                with continuing(item.traceparent):
                    if not await self._carry_out_one(item):
                        continue
            except (grpc.aio.AioRpcError, OSError, TimeoutError) as error:
                log.warning("preemption effect failed; retried", extra={"job": item.job_id, "error": repr(error)})
                continue
            await store.mark_done(self.pool, item.id)
            done += 1
        if done:
            self._notify()
        return done

    async def _carry_out_one(self, item: store.OutboxItem) -> bool:
        """One effect; False when it is left to do."""
        if item.kind == "command":
            command = await self.render(item)
            if command is not None:
                await self.producer.publish(PREEMPTION_COMMANDS, item.job_id, command, event_id=command.command_id)
        elif item.kind == "checkpoint":
            report = checkpoints_pb2.CheckpointReport.FromString(item.payload)
            event_id = f"{item.job_id}/{item.generation}/checkpoint/{report.step}"
            await self.producer.publish(CHECKPOINTS, item.job_id, report, event_id=event_id)
        elif item.kind == "release":
            return await self._release(item)
        return True

    async def _release(self, item: store.OutboxItem) -> bool:
        """Placement.Release as PREEMPTED (idempotent); False when placement is not configured (left to do)."""
        if self.placement_address is None:
            if not self._warned_no_placement:
                log.warning("KUMIKI_PLACEMENT_ADDRESS is not set: evicted jobs are not released by the coordinator")
                self._warned_no_placement = True
            return True  # nothing this coordinator can do; a later BOUND still gets RESUME
        if self._channel is None:
            self._channel = client_channel(  # mTLS with the service's own certificate when KUMIKI_GRPC_* are set
                self.placement_address, interceptors=[ClientTracingInterceptor(self.placement_address, "preemption")]
            )
        stub = placement_pb2_grpc.PlacementStub(self._channel)
        victim = await store.load(self.pool, item.job_id, item.generation)
        beneficiary = (
            common_pb2.JobRef(job_id=victim.protocol.beneficiary, generation=victim.protocol.beneficiary_generation)
            if victim is not None and victim.protocol.beneficiary
            else None
        )
        await stub.Release(
            placement_pb2.ReleaseRequest(
                job=common_pb2.JobRef(job_id=item.job_id, generation=item.generation),
                reason="preempted",
                final_state=events_pb2.JOB_STATE_PREEMPTED,
                lost_gpu_seconds=item.lost_gpu_seconds,
                beneficiary=beneficiary,
                # why it was chosen: a placement restarted while the victim drained knows it only from here
                preemption_reason=victim.protocol.reason if victim is not None else "",
            ),
            timeout=10.0,
        )
        async with self.pool.acquire() as connection, connection.transaction():
            stored = await store.load(connection, item.job_id, item.generation, lock=True)
            if stored is not None:
                await store.save(connection, core.released(stored.protocol), stored.assignments)
        return True

    # ---- loops -----------------------------------------------------------------------------------------------
    async def run(self, stopping: asyncio.Event, period_s: float = 0.2) -> None:
        """Deadlines and the outbox, until stopped: after a restart the first round resumes what was in flight."""
        while not stopping.is_set():
            try:
                await self.expire_due()
                await self.carry_out()
                await self.expire_held()
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as error:
                log.warning("coordinator round failed; retrying", extra={"error": repr(error)})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.work.wait(), timeout=period_s)
            self.work.clear()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    # ---- Watch -----------------------------------------------------------------------------------------------
    async def watch(self, job_id: str, generation: int) -> AsyncIterator[events_pb2.PreemptionCommand]:
        """The commands of one attempt, in order, each once; ends after EVICT (or RESUME of a later attempt)."""
        sent: set[core.Action] = set()
        while True:
            changed = self._changed
            rows = await self.pool.fetch(
                "SELECT generation FROM preemption.protocols WHERE job_id = $1 AND (generation = $2"
                " OR resume_generation = $2) ORDER BY generation",
                job_id,
                generation,
            )
            for row in rows:
                stored = await store.load(self.pool, job_id, row["generation"])
                if stored is None:
                    continue
                for action in core.commands_to_watch(stored.protocol, generation):
                    if action not in sent:
                        sent.add(action)
                        yield render(stored, action, self.grace_period_s)
            if core.Action.EVICT in sent:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=1.0)


def labelled_inc(counter: Counter, label: str) -> None:
    counter.labels(label).inc()


def render(stored: store.Stored, action: core.Action, grace_period_s: float) -> events_pb2.PreemptionCommand:
    """The command on the wire, from the protocol as stored (rendering twice gives the same command)."""
    protocol = stored.protocol
    generation = protocol.resume_generation if action is core.Action.RESUME else protocol.generation
    command = events_pb2.PreemptionCommand(
        command_id=f"{protocol.job_id}/{generation}/{action.value}",
        job=common_pb2.JobRef(job_id=protocol.job_id, generation=generation),
        action=ACTION_TO_WIRE[action],
        reason=protocol.reason,
        decision_id=protocol.decision_id,
        queue=protocol.queue,
        gpus=protocol.gpus,
    )
    command.deadline.CopyFrom(_stamp(protocol.deadline_unix_s))
    command.traceparent = stored.traceparent  # the newest command's step: the job's Report continues it
    if protocol.beneficiary:
        command.beneficiary.CopyFrom(
            common_pb2.JobRef(job_id=protocol.beneficiary, generation=protocol.beneficiary_generation)
        )
    if action is core.Action.CHECKPOINT:
        command.issued_at.CopyFrom(_stamp(protocol.requested_unix_s))
    elif action is core.Action.EVICT:
        command.issued_at.CopyFrom(_stamp(protocol.evicted_unix_s))
        command.checkpoint_uri = protocol.checkpoint_uri
        command.checkpoint_step = protocol.checkpoint_step
        command.forced = protocol.forced
        command.lost_gpu_seconds = protocol.lost_gpu_seconds
        command.grace_period_s = grace_period_s
        if stored.assignments:
            command.assignments.extend(events_pb2.PreemptionCommand.FromString(stored.assignments).assignments)
    else:
        command.issued_at.CopyFrom(_stamp(protocol.evicted_unix_s))
        command.checkpoint_uri = protocol.checkpoint_uri
        command.checkpoint_step = protocol.checkpoint_step
    return command
