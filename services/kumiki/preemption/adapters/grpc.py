"""gRPC Checkpoints: jobs report checkpoints, watch for commands and ask where to resume from."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, events_pb2
from kumiki.common.grpcutil import InvalidRequest, abort_invalid, require_job
from kumiki.preemption.adapters.coordinator import Coordinator
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.preemption.core import CheckpointRecord, validate_report


class CheckpointsServicer(checkpoints_pb2_grpc.CheckpointsServicer):
    """`coordinator` None: a registry only (reports are recorded; no protocol, no Watch commands)."""

    def __init__(self, registry: CheckpointRegistry, coordinator: Coordinator | None = None) -> None:
        self.registry = registry
        self.coordinator = coordinator

    async def Report(
        self, request: checkpoints_pb2.CheckpointReport, context: grpc.aio.ServicerContext
    ) -> checkpoints_pb2.CheckpointAck:
        completed = request.completed_at.seconds + request.completed_at.nanos / 1e9
        problems = validate_report(request.job.job_id, request.job.generation, request.uri, completed, request.step)
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(f"{f}: {p}" for f, p in problems))
        report = CheckpointRecord(request.job.job_id, request.job.generation, request.uri, request.step, completed)
        if self.coordinator is None:
            latest = await self.registry.record(report)
        else:
            latest = await self.coordinator.report(report, request)
        return checkpoints_pb2.CheckpointAck(recorded=latest == report, latest_uri=latest.uri)

    async def Watch(
        self, request: checkpoints_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[events_pb2.PreemptionCommand]:
        try:
            require_job(request.job)
        except InvalidRequest as error:
            await abort_invalid(context, error)
            return
        if self.coordinator is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this preemption service runs no coordinator")
            return
        async for command in self.coordinator.watch(request.job.job_id, request.job.generation):
            yield command

    async def ResumePoint(
        self, request: checkpoints_pb2.ResumePointRequest, context: grpc.aio.ServicerContext
    ) -> checkpoints_pb2.ResumePointResponse:
        try:
            require_job(request.job)
        except InvalidRequest as error:
            await abort_invalid(context, error)
            raise
        latest = await self.registry.latest(request.job.job_id)
        if latest is None or latest.generation > request.job.generation:
            return checkpoints_pb2.ResumePointResponse(found=False)
        return checkpoints_pb2.ResumePointResponse(
            found=True, uri=latest.uri, step=latest.step, generation=latest.generation
        )
