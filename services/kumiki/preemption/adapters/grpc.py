"""gRPC Checkpoints: jobs report checkpoints, watch for commands and ask where to resume from."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, events_pb2
from kumiki.common.grpcutil import InvalidRequest, abort_invalid, require_job, unix_seconds
from kumiki.preemption.adapters.coordinator import Coordinator
from kumiki.preemption.adapters.identity import IdentityRefused, JobIdentity
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.preemption.core import CheckpointRecord, validate_report


class CheckpointsServicer(checkpoints_pb2_grpc.CheckpointsServicer):
    """`coordinator` None: a registry only (reports are recorded; no protocol, no Watch commands). `identity`:
    when set, every call about a job must come from that job's own identity (kumiki.preemption.adapters.identity)."""

    def __init__(
        self, registry: CheckpointRegistry, coordinator: Coordinator | None = None, identity: JobIdentity | None = None
    ) -> None:
        self.registry = registry
        self.coordinator = coordinator
        self.identity = identity

    async def _only_the_job(self, context: grpc.aio.ServicerContext, method: str, job_id: str) -> None:
        if self.identity is None:
            return
        try:
            await self.identity.check(context, method, job_id)
        except IdentityRefused as refused:
            await context.abort(refused.code, refused.reason)

    async def Report(
        self, request: checkpoints_pb2.CheckpointReport, context: grpc.aio.ServicerContext
    ) -> checkpoints_pb2.CheckpointAck:
        completed = unix_seconds(request.completed_at)
        job = request.job
        problems = validate_report(
            job.job_id, job.generation, request.uri, completed, request.step, request.total_steps
        )
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(f"{f}: {p}" for f, p in problems))
        await self._only_the_job(context, "Report", job.job_id)
        report = CheckpointRecord(job.job_id, job.generation, request.uri, request.step, completed, request.total_steps)
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
        await self._only_the_job(context, "Watch", request.job.job_id)
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
        await self._only_the_job(context, "ResumePoint", request.job.job_id)
        latest = await self.registry.latest(request.job.job_id)
        if latest is None or latest.generation > request.job.generation:
            return checkpoints_pb2.ResumePointResponse(found=False)
        return checkpoints_pb2.ResumePointResponse(
            found=True, uri=latest.uri, step=latest.step, generation=latest.generation
        )
