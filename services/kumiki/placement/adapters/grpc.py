"""gRPC Placement: Bind, Release and Explain over the live book, plus the scheduling cycle for pending jobs.

Everything that changes the book runs on the event loop thread without awaiting in between, so two
concurrent Binds can never see the same free GPU. A bind is answered only after its events are
acknowledged by the broker; if publishing fails the allocation is undone and the caller gets UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Gauge, Histogram

from kumiki.common.contracts.v1 import events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, LogBudget, abort_invalid
from kumiki.common.metrics import labelled
from kumiki.common.tracing import recording
from kumiki.placement.adapters.admission import Admission
from kumiki.placement.adapters.convert import (
    assignments,
    bind_command,
    explain_response,
    pending_reason,
    release_state,
)
from kumiki.placement.adapters.events import DecisionPublisher
from kumiki.placement.adapters.preempting import publish_preemptions, rebinding, release_preempted
from kumiki.placement.core import BindCommand, BindConflict, BoundJob, PlacementBook, quota_reason
from kumiki.placement.observe import book_stranded_gpus, pending_by_reason
from kumiki.quota.adapters.auth import QueueAuthorizer, Unauthenticated
from kumiki.sched.placement import PendingReason

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.placement")
# Requests of one BindStream decided ahead of the answer being written: enough to keep the event log's
# round trip busy, bounded so a caller that stops reading answers stops being read.
STREAM_WINDOW = 256
STREAM_SPAN = {"rpc.system": "grpc", "rpc.service": "kumiki.v1.Placement", "rpc.method": "BindStream"}

BINDS = Counter("kumiki_placement_binds_total", "Bind calls by outcome", ["outcome"])
BIND_SECONDS = Histogram(
    "kumiki_placement_bind_seconds",
    "Bind latency inside the service",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
# label children bound once: a labels() lookup on every bind costs more than the increment
BINDS_INVALID, BINDS_CONFLICT, BINDS_REPLAYED, BINDS_BOUND, BINDS_PENDING = (
    BINDS.labels(outcome) for outcome in ("invalid", "conflict", "replayed", "bound", "pending")
)
PENDING = Gauge("kumiki_placement_pending_jobs", "Jobs waiting for placement")
QUEUE_WAIT = Histogram(
    "kumiki_placement_queue_wait_seconds",
    "Time from a job's arrival to its bind, by queue (0 for jobs placed on arrival)",
    ["queue"],
    buckets=(0.001, 1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600),
)
JOB_COMPLETION = Histogram(
    "kumiki_placement_job_completion_seconds",
    "Job completion time (queue wait + run time) of jobs released as completed or failed, by queue",
    ["queue", "final_state"],
    buckets=(60, 300, 900, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600, 7 * 24 * 3600, 30 * 24 * 3600),
)
ALLOCATED = Gauge("kumiki_placement_allocated_gpus", "GPU capacity allocated (fractions and MIG counted)")
REFUSED = Counter(
    "kumiki_placement_refused_total", "Bind/Release calls refused: the caller is unknown or not an owner of the queue"
)
CYCLE_BINDS = Counter("kumiki_placement_cycle_binds_total", "Pending jobs bound by the scheduling cycle")
STRANDED = Gauge(
    "kumiki_placement_stranded_gpus",
    "Free GPUs on healthy nodes that no pod of any job waiting for capacity fits, by node shape (fragmentation)",
    ["shape"],
)
PENDING_BY_REASON = Gauge(
    "kumiki_placement_pending_jobs_by_reason", "Jobs waiting, by the resource their pending reason names", ["reason"]
)


def observe_book(book: PlacementBook) -> None:
    """Fragmentation and pending reasons, once a scheduling cycle (a reason no job has any more reads 0)."""
    for shape, gpus in book_stranded_gpus(book).items():
        STRANDED.labels(shape).set(gpus)
    counts = pending_by_reason(book.pending.values())
    for reason in {*counts, *_reasons_seen}:
        PENDING_BY_REASON.labels(reason).set(counts.get(reason, 0))
    _reasons_seen.update(counts)


_reasons_seen: set[str] = set()


def _waited(job: BoundJob) -> None:
    """Count a published bind's wait in its queue."""
    labelled(QUEUE_WAIT, job.command.queue).observe(job.waited_s)


def _note(**attributes: str | int | float | bool | list[str]) -> None:
    """Attributes on the decision's span, when there is one recording."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def _nobody_reads(task: asyncio.Task[placement_pb2.BindStreamResponse]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("bind stream answer lost with its caller", extra={"error": repr(task.exception())})


class BindRefused(Exception):
    """A Bind that gets no answer but a status: unary calls end with it, streams carry it in the answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    def __init__(
        self,
        book: PlacementBook,
        publisher: DecisionPublisher,
        admission: Admission,
        authorizer: QueueAuthorizer | None = None,
    ) -> None:
        self.book = book
        self.publisher = publisher
        self.admission = admission
        self.authorizer = authorizer  # None: any caller may bind into any queue (no KUMIKI_PLACEMENT_QUEUES_FILE)
        self._refusals = LogBudget()
        self.wake = asyncio.Event()
        self._inflight: dict[tuple[str, int], asyncio.Future[placement_pb2.BindResponse]] = {}
        self._publishing: set[asyncio.Future[None]] = set()  # started jobs' publications nobody awaits any more

    def _bound_response(
        self, job: BoundJob, decision: events_pb2.SchedulingDecision | None = None
    ) -> placement_pb2.BindResponse:
        """`decision`: the one just published (a replayed bind has none to name)."""
        return placement_pb2.BindResponse(
            outcome=placement_pb2.BindResponse.OUTCOME_BOUND,
            assignments=assignments(job) if decision is None else decision.assignments,
            decision_id="" if decision is None else decision.decision_id,
        )

    def _caller(self, context: grpc.aio.ServicerContext, method: str) -> str | None:
        """The caller's identity when queue owners are checked (None when they are not), or BindRefused."""
        if self.authorizer is None:
            return None
        try:
            return self.authorizer.identity(context)
        except Unauthenticated as error:
            self._refused(method, None, "", "", str(error))
            raise BindRefused(grpc.StatusCode.UNAUTHENTICATED, str(error)) from None

    def _authorize(self, method: str, caller: str | None, queue: str, job_id: str) -> None:
        """BindRefused(PERMISSION_DENIED) unless `caller` owns `queue` (or an ancestor); logged when refused."""
        if self.authorizer is None:
            return
        refusal = "no caller identity" if caller is None else self.authorizer.refusal(caller, queue)
        if refusal is not None:
            self._refused(method, caller, queue, job_id, refusal)
            raise BindRefused(grpc.StatusCode.PERMISSION_DENIED, refusal)

    def _refused(self, method: str, caller: str | None, queue: str, job_id: str, reason: str) -> None:
        REFUSED.inc()
        left_out = self._refusals.take()
        if left_out is not None:  # one WARNING a refusal, within the budget: a caller cannot flood the log
            extra = {"method": method, "identity": caller, "queue": queue, "job": job_id, "reason": reason}
            log.warning("request refused", extra={**extra, "not_logged_since_last": left_out})

    async def Bind(
        self, request: placement_pb2.BindRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.BindResponse:
        try:
            return await self.decide(request, self._caller(context, "Bind"))
        except BindRefused as refused:
            await context.abort(refused.code, refused.message)
            raise

    async def BindStream(
        self, requests: AsyncIterator[placement_pb2.BindRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[placement_pb2.BindStreamResponse]:
        """Pipelined: every request is decided as soon as it is read, answers leave in request order.

        Each request is its own SERVER span, a child of the stream's traceparent (one per message would
        need the caller to send context with every message; the stream's is what gRPC metadata carries).
        """
        parent = propagate.extract(
            {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)},
            context=otel_context.Context(),
        )
        traced = recording() or trace.get_current_span(parent).get_span_context().is_valid
        try:
            caller = self._caller(context, "BindStream")
        except BindRefused as refused:
            await context.abort(refused.code, refused.message)
        answers: asyncio.Queue[asyncio.Task[placement_pb2.BindStreamResponse] | None] = asyncio.Queue(
            maxsize=STREAM_WINDOW
        )

        async def read() -> None:
            try:
                async for request in requests:
                    answer = self._stream_answer(request, parent if traced else None, caller)
                    await answers.put(asyncio.create_task(answer))
            finally:
                await answers.put(None)

        reader = asyncio.create_task(read(), name="bind-stream-reader")
        try:
            while (answer := await answers.get()) is not None:
                yield await answer
            await reader  # re-raises a broken stream
        finally:
            reader.cancel()
            while not answers.empty():  # the caller went away: decisions in flight still finish and publish
                unread = answers.get_nowait()
                if unread is not None:
                    unread.add_done_callback(_nobody_reads)

    async def _stream_answer(
        self, request: placement_pb2.BindRequest, parent: otel_context.Context | None, caller: str | None = None
    ) -> placement_pb2.BindStreamResponse:
        """`parent` None: tracing is off and the caller sent no trace context, so no span at all."""
        try:
            if parent is None:
                response = await self.decide(request, caller)
            else:
                with tracer.start_as_current_span(
                    "kumiki.v1.Placement/BindStream", context=parent, kind=SpanKind.SERVER, attributes=STREAM_SPAN
                ):
                    response = await self.decide(request, caller)
        except BindRefused as refused:
            return placement_pb2.BindStreamResponse(
                job=request.job, status_code=refused.code.value[0], error=refused.message
            )
        return placement_pb2.BindStreamResponse(job=request.job, response=response)

    async def decide(self, request: placement_pb2.BindRequest, caller: str | None = None) -> placement_pb2.BindResponse:
        """Bind's answer, or BindRefused with the status a unary call ends with. `caller`: the identity checked
        against the queue's owners when they are checked (an invalid request is named first, then the owner)."""
        started = time.perf_counter()
        try:
            command = bind_command(request)
        except InvalidRequest as error:
            BINDS_INVALID.inc()
            raise BindRefused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from None
        self._authorize("Bind", caller, command.queue, command.job_id)
        attempt = (command.job_id, command.generation)
        running = self._inflight.get(attempt)
        if running is not None:  # the same job and generation is being bound right now: share its answer
            return await asyncio.shield(running)
        future: asyncio.Future[placement_pb2.BindResponse] = asyncio.get_running_loop().create_future()
        self._inflight[attempt] = future
        try:
            response = await self._bind(command)
            future.set_result(response)
            return response
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # mark retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            del self._inflight[attempt]
            BIND_SECONDS.observe(time.perf_counter() - started)

    async def _bind(self, command: BindCommand) -> placement_pb2.BindResponse:
        """The decision as one span (admission and the published events are its children) when traced."""
        if not recording():
            return await self._schedule(command)
        attributes: dict[str, str | int | float] = {
            "kumiki.job.id": command.job_id,
            "kumiki.job.generation": command.generation,
            "kumiki.queue": command.queue,
            "kumiki.gpus": command.request.gpu_demand,
            "kumiki.pods": len(command.request.pods),
            "kumiki.placement.policy": self.publisher.policy,
        }
        with tracer.start_as_current_span("schedule", kind=SpanKind.INTERNAL, attributes=attributes):
            return await self._schedule(command)

    async def _schedule(self, command: BindCommand) -> placement_pb2.BindResponse:
        waiting = self.book.pending.get(command.job_id)
        arrives = waiting is None or waiting.command.generation != command.generation  # not a caller's retry
        existing = self.book.bound.get(command.job_id)
        if waiting is not None and waiting.held and self.book.yields(command.job_id):
            # a victim's retry before the job its GPUs were freed for was admitted: it waits, held, behind it
            return await self._pending(command, waiting.reason, arrives)
        if existing is None or existing.command.generation != command.generation:
            denied = await self.admission.admit(command)
            _note(**{"kumiki.quota.admitted": denied is None})
            if denied is not None:
                reason = quota_reason(command, denied)
                self.book.hold(command, reason, time.time())
                return await self._pending(command, reason, arrives)
        try:
            outcome = self.book.bind(command, time.time())
        except BindConflict as error:
            _note(**{"kumiki.outcome": "conflict"})
            BINDS_CONFLICT.inc()
            raise BindRefused(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from None
        if outcome.started:  # the pass this arrival ran also started jobs that were waiting
            await self._publish_started(outcome.started)
        if self.book.preemptions:  # the pass named victims: the coordinator checkpoints and evicts them
            await publish_preemptions(self.book, self.publisher)
        if outcome.job is not None:
            _note(
                **{
                    "kumiki.outcome": "replayed" if outcome.replayed else "bound",
                    "kumiki.nodes": sorted(set(outcome.job.node_names)),
                    "kumiki.started_with": len(outcome.started),
                }
            )
        if outcome.job is not None and outcome.replayed:
            BINDS_REPLAYED.inc()
            return self._bound_response(outcome.job)
        if outcome.job is not None:
            decision = await self._publish_bound(outcome.job)
            BINDS_BOUND.inc()
            _waited(outcome.job)
            return self._bound_response(outcome.job, decision)
        assert outcome.reason is not None
        return await self._pending(command, outcome.reason, arrives)

    async def _pending(self, command: BindCommand, reason: PendingReason, arrives: bool) -> placement_pb2.BindResponse:
        """`arrives`: the job has just joined the queue, and is not durable until its SUBMITTED event is."""
        _note(
            **{
                "kumiki.outcome": "pending",
                "kumiki.pending.reason": reason.explain(),
                "kumiki.pending.resource": reason.resource,
            }
        )
        waiting = self.book.pending.get(command.job_id)
        submitted_s = waiting.submitted_s if arrives and waiting is not None else None
        try:
            decision_id = await self.publisher.pending(command, reason, submitted_s)
        except Exception as error:
            if submitted_s is None:
                raise
            self.book.withdraw(command.job_id)  # a restart would not know it: the caller retries instead
            raise BindRefused(
                grpc.StatusCode.UNAVAILABLE, f"the event log did not acknowledge the job's arrival: {error}"
            ) from None
        BINDS_PENDING.inc()
        PENDING.set(len(self.book.pending))
        return placement_pb2.BindResponse(
            outcome=placement_pb2.BindResponse.OUTCOME_PENDING,
            reasons=[pending_reason(reason)],
            decision_id=decision_id,
        )

    async def _publish_bound(self, job: BoundJob) -> events_pb2.SchedulingDecision:
        try:
            return await self.publisher.bound(job)
        except Exception as error:
            self.book.unbind(job.command.job_id)  # not durable, so not granted
            log.error("bind not published; allocation undone", extra={"job": job.command.job_id, "error": repr(error)})
            raise BindRefused(
                grpc.StatusCode.UNAVAILABLE, f"the event log did not acknowledge the bind: {error}"
            ) from None

    async def Release(
        self, request: placement_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ReleaseResponse:
        try:
            state = release_state(request)
        except InvalidRequest as error:
            await abort_invalid(context, error)
            raise
        if self.authorizer is not None:  # only an owner of the job's queue (or an ancestor) may release it
            held = self.book.bound.get(request.job.job_id) or self.book.pending.get(request.job.job_id)
            try:
                caller = self._caller(context, "Release")
                if held is not None:
                    self._authorize("Release", caller, held.command.queue, request.job.job_id)
            except BindRefused as refused:
                await context.abort(refused.code, refused.message)
        if state == events_pb2.JOB_STATE_PREEMPTED:  # the coordinator evicted it: free, requeue next generation
            response = await release_preempted(self.book, self.publisher, self.admission, request)
            self.wake.set()
            return response
        held_now = self.book.bound.get(request.job.job_id) or self.book.preempted_attempt(request.job.job_id, 0)
        if held_now is not None and (request.job.job_id, held_now.command.generation) in self.book.releasing:
            # its eviction is being released as PREEMPTED right now: that wins, the next generation runs instead
            return placement_pb2.ReleaseResponse(released=False, gpus_freed=0.0)
        waiting = self.book.pending.get(request.job.job_id)
        withdrawn = waiting is not None and request.job.generation in (0, waiting.command.generation)
        if waiting is not None and withdrawn:
            self.book.withdraw(request.job.job_id)
            await self.publisher.withdrawn(waiting.command, request.reason or "withdrawn before it was placed")
            PENDING.set(len(self.book.pending))
        job = self.book.release(request.job.job_id, request.job.generation)
        if job is None:
            return placement_pb2.ReleaseResponse(released=withdrawn, gpus_freed=0.0)
        ended = state != events_pb2.JOB_STATE_RELEASED  # COMPLETED or FAILED (release_state allows no other)
        ran_s = max(0.0, time.time() - job.bound_s) if ended else 0.0
        await self.publisher.released(job, request.reason or "released", state, ran_s)
        if ended:
            self.book.mark_ended(job.command.job_id, job.command.generation)
            final_state = events_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()  # type: ignore[arg-type]
            labelled(JOB_COMPLETION, job.command.queue, final_state).observe(job.waited_s + ran_s)
        self.wake.set()  # the freed capacity goes to the queue on the next pass, right away
        return placement_pb2.ReleaseResponse(released=True, gpus_freed=job.command.request.gpu_demand)

    async def Explain(
        self, request: placement_pb2.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ExplainResponse:
        if not request.job_id:
            await abort_invalid(context, InvalidRequest("job_id", "required"))
        return explain_response(self.book.explain(request.job_id, time.time()))

    # ---- the scheduling cycle -------------------------------------------------------------------
    async def run_cycles(self, stopping: asyncio.Event, period_s: float = 1.0) -> None:
        """Retry pending jobs when capacity may have freed up (a release, a node change) and periodically."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=period_s)
            self.wake.clear()
            await self.cycle()

    async def cycle(self) -> int:
        """Quota's held jobs are asked again, then one pass of the core's queue policy; its starts are published."""
        now = time.time()
        for held in self.book.held_jobs(now):
            command = held.command
            if (command.job_id, command.generation) in self._inflight or command.job_id not in self.book.pending:
                continue
            if await self.admission.admit(command) is None and command.job_id in self.book.pending:
                self.book.admit(command.job_id, now)
        started = self.book.cycle(now)
        await self._publish_started(started)
        await publish_preemptions(self.book, self.publisher)
        PENDING.set(len(self.book.pending))
        ALLOCATED.set(self.book.state.allocated_gpus())
        observe_book(self.book)
        return len(started)

    async def _publish_started(self, started: Sequence[BoundJob]) -> None:
        """Publish jobs a pass started from the queue; one that cannot be published waits again.

        Shielded: a Bind whose caller gave up (its deadline, during a broker outage) must not cancel these
        publications. Undoing the allocations then would free GPUs whose BOUND events the producer still
        delivers once the broker answers, and the log would show two jobs on them (found by the fault-injection
        run, kumiki.replay.faults); the rest of the pass's jobs would stay granted and never be published."""
        if not started:
            return
        publishing = asyncio.ensure_future(self._publish_each(list(started)))
        self._publishing.add(publishing)
        publishing.add_done_callback(self._publishing.discard)
        await asyncio.shield(publishing)

    async def _publish_each(self, started: Sequence[BoundJob]) -> None:
        for job in started:
            try:
                with rebinding(job):  # a requeued victim's bind joins its preemption's trace
                    await self.publisher.bound(job, events_pb2.DECISION_KIND_BACKFILL)
            except Exception as error:  # not durable, so not granted: it waits again
                if self.book.bound.get(job.command.job_id) is job:
                    self.book.unbind(job.command.job_id, requeue=True, now=time.time())
                log.error(
                    "started job not published; it waits again", extra={"job": job.command.job_id, "error": repr(error)}
                )
                continue
            CYCLE_BINDS.inc()
            _waited(job)
