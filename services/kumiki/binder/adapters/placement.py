"""The binder's Placement client: one long-lived BindStream for every gang (answers come in request order, so
each request's future is resolved in turn), and unary Release.

Tracing: gRPC metadata is per call, so a shared stream cannot carry each gang's trace context. A gang whose
span is sampled goes as a unary Bind instead (a CLIENT span, its traceparent in the call's metadata: the
decision is one trace from the binder to the Binding); every other gang goes over the stream, which carries
one context of its own: not sampled when the binder traces (Placement's parent-based sampler then records
nothing for the gangs the binder's sampler left out), none when it does not."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.tracing import ClientTracingInterceptor, recording

log = logging.getLogger(__name__)


class PlacementUnavailable(ConnectionError):
    """The stream broke with requests unanswered; the caller submits them again (same generation)."""


# a unary Bind that fails with one of these is Placement away, not Placement's answer: the gang goes again
_UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


def stream_metadata() -> tuple[tuple[str, str], ...]:
    """The BindStream's own trace context: an unsampled one when the binder records spans, so what it left out
    of its sample stays out downstream too; nothing when it does not (Placement's own sampler decides)."""
    if not recording():
        return ()
    ids = RandomIdGenerator()
    unsampled = trace.SpanContext(
        ids.generate_trace_id(), ids.generate_span_id(), is_remote=False, trace_flags=trace.TraceFlags(0)
    )
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(unsampled)))
    return tuple(carrier.items())


class PlacementClient:
    def __init__(self, address: str, credentials: grpc.ChannelCredentials | None = None, depth: int = 256) -> None:
        self.address = address
        interceptors = [ClientTracingInterceptor(address, component="binder")]
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(address, interceptors=interceptors)
        else:
            self.channel = grpc.aio.secure_channel(address, credentials, interceptors=interceptors)
        self.stub = placement_pb2_grpc.PlacementStub(self.channel)
        self._outgoing: asyncio.Queue[placement_pb2.BindRequest | None] = asyncio.Queue()
        self._waiting: deque[asyncio.Future[placement_pb2.BindStreamResponse]] = deque()
        self._reader: asyncio.Task[None] | None = None
        self._slots = asyncio.Semaphore(depth)  # answers Placement owes us at once (its stream pipelines 256)
        self._lock = asyncio.Lock()

    async def close(self) -> None:
        if self._reader is not None:
            self._outgoing.put_nowait(None)
            self._reader.cancel()
        await self.channel.close()

    async def _requests(
        self, queue: asyncio.Queue[placement_pb2.BindRequest | None]
    ) -> AsyncIterator[placement_pb2.BindRequest]:
        while True:
            request = await queue.get()
            if request is None:
                return
            yield request

    async def _ensure_stream(self) -> None:
        async with self._lock:
            if self._reader is not None and not self._reader.done():
                return
            self._outgoing = asyncio.Queue()
            # opened outside the gang that opened it: the stream outlives it and serves every other gang
            token = otel_context.attach(otel_context.Context())
            try:
                call = self.stub.BindStream(self._requests(self._outgoing), metadata=stream_metadata())
                self._reader = asyncio.create_task(self._read(call), name="placement-bind-stream")
            finally:
                otel_context.detach(token)

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        try:
            async for answer in call:
                if self._waiting:
                    future = self._waiting.popleft()
                    if not future.done():
                        future.set_result(answer)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as error:
            log.warning("BindStream closed", extra={"reason": str(error), "unanswered": len(self._waiting)})
        finally:
            while self._waiting:
                future = self._waiting.popleft()
                if not future.done():
                    future.set_exception(PlacementUnavailable(f"BindStream to {self.address} closed"))

    async def bind(
        self, request: placement_pb2.BindRequest, timeout_s: float = 60.0
    ) -> placement_pb2.BindStreamResponse:
        """Placement's answer to one gang (BOUND / PENDING, or the status it refused with)."""
        if trace.get_current_span().is_recording():
            return await self._bind_traced(request, timeout_s)
        async with self._slots:
            await self._ensure_stream()
            future: asyncio.Future[placement_pb2.BindStreamResponse] = asyncio.get_running_loop().create_future()
            self._waiting.append(future)  # appended and queued together: answers pair with requests in order
            self._outgoing.put_nowait(request)
            try:
                return await asyncio.wait_for(asyncio.shield(future), timeout_s)
            except TimeoutError:
                raise PlacementUnavailable(f"no answer from {self.address} within {timeout_s:.0f}s") from None

    async def _bind_traced(
        self, request: placement_pb2.BindRequest, timeout_s: float
    ) -> placement_pb2.BindStreamResponse:
        """A sampled gang's unary Bind, answered as the stream would answer it."""
        async with self._slots:
            try:
                response = await self.stub.Bind(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as error:
                if error.code() in _UNAVAILABLE:
                    raise PlacementUnavailable(f"Bind to {self.address}: {error.code().name}") from None
                return placement_pb2.BindStreamResponse(
                    job=request.job, status_code=error.code().value[0], error=str(error.details() or "")
                )
        return placement_pb2.BindStreamResponse(job=request.job, response=response)

    async def explain(self, job_id: str, timeout_s: float = 10.0) -> placement_pb2.ExplainResponse:
        """What Placement says of a job now (pending with its reasons, bound, unknown); reads, changes nothing."""
        try:
            answer: placement_pb2.ExplainResponse = await self.stub.Explain(
                placement_pb2.ExplainRequest(job_id=job_id), timeout=timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise PlacementUnavailable(f"Explain to {self.address}: {error.code().name}") from None
        return answer

    async def release(self, job_id: str, generation: int, reason: str, final_state: int = 0) -> bool:
        request = placement_pb2.ReleaseRequest(
            job=common_pb2.JobRef(job_id=job_id, generation=generation),
            reason=reason,
            final_state=final_state or events_pb2.JOB_STATE_RELEASED,  # type: ignore[arg-type]
        )
        response = await self.stub.Release(request, timeout=30)
        return bool(response.released)
