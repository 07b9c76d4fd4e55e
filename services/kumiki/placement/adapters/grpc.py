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

import grpc
from prometheus_client import Counter, Gauge, Histogram

from kumiki.common.contracts.v1 import events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, abort_invalid
from kumiki.placement.adapters.admission import Admission
from kumiki.placement.adapters.convert import assignments, bind_command, pending_reason
from kumiki.placement.adapters.events import DecisionPublisher
from kumiki.placement.core import BindCommand, BindConflict, BoundJob, PlacementBook
from kumiki.sched.placement import PendingReason

log = logging.getLogger(__name__)

BINDS = Counter("kumiki_placement_binds_total", "Bind calls by outcome", ["outcome"])
BIND_SECONDS = Histogram(
    "kumiki_placement_bind_seconds",
    "Bind latency inside the service",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
PENDING = Gauge("kumiki_placement_pending_jobs", "Jobs waiting for placement")
ALLOCATED = Gauge("kumiki_placement_allocated_gpus", "GPU capacity allocated (fractions and MIG counted)")
CYCLE_BINDS = Counter("kumiki_placement_cycle_binds_total", "Pending jobs bound by the scheduling cycle")


class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    def __init__(self, book: PlacementBook, publisher: DecisionPublisher, admission: Admission) -> None:
        self.book = book
        self.publisher = publisher
        self.admission = admission
        self.wake = asyncio.Event()
        self._inflight: dict[str, asyncio.Future[placement_pb2.BindResponse]] = {}

    def _bound_response(self, job: BoundJob, decision_id: str = "") -> placement_pb2.BindResponse:
        return placement_pb2.BindResponse(
            outcome=placement_pb2.BindResponse.OUTCOME_BOUND, assignments=assignments(job), decision_id=decision_id
        )

    async def Bind(
        self, request: placement_pb2.BindRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.BindResponse:
        started = time.perf_counter()
        try:
            command = bind_command(request)
        except InvalidRequest as error:
            BINDS.labels("invalid").inc()
            await abort_invalid(context, error)
            raise
        running = self._inflight.get(command.job_id)
        if running is not None:  # the same job is being bound right now: share its answer
            return await asyncio.shield(running)
        future: asyncio.Future[placement_pb2.BindResponse] = asyncio.get_running_loop().create_future()
        self._inflight[command.job_id] = future
        try:
            response = await self._bind(command, context)
            future.set_result(response)
            return response
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # mark retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            del self._inflight[command.job_id]
            BIND_SECONDS.observe(time.perf_counter() - started)

    async def _bind(self, command: BindCommand, context: grpc.aio.ServicerContext) -> placement_pb2.BindResponse:
        existing = self.book.bound.get(command.job_id)
        if existing is None or existing.command.generation != command.generation:
            denied = await self.admission.admit(command)
            if denied is not None:
                reason = PendingReason(command.job_id, "quota", denied, command.request.pods[0].shape())
                self.book.hold(command, reason)
                return await self._pending(command, reason)
        try:
            outcome = self.book.bind(command)
        except BindConflict as error:
            BINDS.labels("conflict").inc()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
            raise
        if outcome.job is not None and outcome.replayed:
            BINDS.labels("replayed").inc()
            return self._bound_response(outcome.job)
        if outcome.job is not None:
            decision_id = await self._publish_bound(outcome.job, context)
            BINDS.labels("bound").inc()
            return self._bound_response(outcome.job, decision_id)
        assert outcome.reason is not None
        return await self._pending(command, outcome.reason)

    async def _pending(self, command: BindCommand, reason: PendingReason) -> placement_pb2.BindResponse:
        decision_id = await self.publisher.pending(command, reason)
        BINDS.labels("pending").inc()
        PENDING.set(len(self.book.pending))
        return placement_pb2.BindResponse(
            outcome=placement_pb2.BindResponse.OUTCOME_PENDING,
            reasons=[pending_reason(reason)],
            decision_id=decision_id,
        )

    async def _publish_bound(self, job: BoundJob, context: grpc.aio.ServicerContext) -> str:
        try:
            return await self.publisher.bound(job)
        except Exception as error:
            self.book.unbind(job.command.job_id)  # not durable, so not granted
            log.error("bind not published; allocation undone", extra={"job": job.command.job_id, "error": repr(error)})
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the event log did not acknowledge the bind: {error}")
            raise

    async def Release(
        self, request: placement_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ReleaseResponse:
        if not request.job.job_id:
            await abort_invalid(context, InvalidRequest("job.job_id", "required"))
        withdrawn = self.book.withdraw(request.job.job_id)
        job = self.book.release(request.job.job_id, request.job.generation)
        if job is None:
            return placement_pb2.ReleaseResponse(released=withdrawn, gpus_freed=0.0)
        await self.publisher.released(job, request.reason or "released")
        self.wake.set()
        return placement_pb2.ReleaseResponse(released=True, gpus_freed=job.command.request.gpu_demand)

    async def Explain(
        self, request: placement_pb2.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ExplainResponse:
        if not request.job_id:
            await abort_invalid(context, InvalidRequest("job_id", "required"))
        explanation = self.book.explain(request.job_id)
        response = placement_pb2.ExplainResponse(
            status=explanation.status,
            queue=explanation.queue,
            queue_position=explanation.queue_position,
            reasons=[pending_reason(reason) for reason in explanation.reasons],
        )
        if explanation.job is not None:
            response.assignments.extend(assignments(explanation.job))
        return response

    # ---- the scheduling cycle -------------------------------------------------------------------
    async def run_cycles(self, stopping: asyncio.Event, period_s: float = 1.0) -> None:
        """Retry pending jobs when capacity may have freed up (a release, a node change) and periodically."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=period_s)
            self.wake.clear()
            await self.cycle()

    async def cycle(self) -> int:
        bound = 0
        for pending in self.book.pending_in_order():
            command = pending.command
            if command.job_id in self._inflight or command.job_id not in self.book.pending:
                continue
            if await self.admission.admit(command) is not None:
                continue
            job = self.book.try_pending(command.job_id)
            if job is None:
                continue
            try:
                await self.publisher.bound(job, events_pb2.DECISION_KIND_BACKFILL)
            except BaseException:  # cancelled at shutdown too: an unpublished bind must not stay granted
                self.book.unbind(command.job_id)
                self.book.hold(command, pending.reason)
                raise
            bound += 1
            CYCLE_BINDS.inc()
        PENDING.set(len(self.book.pending))
        ALLOCATED.set(self.book.state.allocated_gpus())  # O(GPUs): once a cycle, not once a bind
        return bound
