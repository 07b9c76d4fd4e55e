"""The binder's Placement client: one long-lived BindStream for every gang (answers come in request order, so
each request's future is resolved in turn), and unary Release."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator

import grpc

from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.tracing import ClientTracingInterceptor, outgoing_metadata

log = logging.getLogger(__name__)


class PlacementUnavailable(ConnectionError):
    """The stream broke with requests unanswered; the caller submits them again (same generation)."""


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
            # the stream's metadata carries the trace context it was opened in (each request Placement
            # decides is a SERVER span under it)
            call = self.stub.BindStream(self._requests(self._outgoing), metadata=outgoing_metadata())
            self._reader = asyncio.create_task(self._read(call), name="placement-bind-stream")

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
        async with self._slots:
            await self._ensure_stream()
            future: asyncio.Future[placement_pb2.BindStreamResponse] = asyncio.get_running_loop().create_future()
            self._waiting.append(future)  # appended and queued together: answers pair with requests in order
            self._outgoing.put_nowait(request)
            try:
                return await asyncio.wait_for(asyncio.shield(future), timeout_s)
            except TimeoutError:
                raise PlacementUnavailable(f"no answer from {self.address} within {timeout_s:.0f}s") from None

    async def release(self, job_id: str, generation: int, reason: str, final_state: int = 0) -> bool:
        request = placement_pb2.ReleaseRequest(
            job=common_pb2.JobRef(job_id=job_id, generation=generation),
            reason=reason,
            final_state=final_state or events_pb2.JOB_STATE_RELEASED,  # type: ignore[arg-type]
        )
        response = await self.stub.Release(request, timeout=30)
        return bool(response.released)
