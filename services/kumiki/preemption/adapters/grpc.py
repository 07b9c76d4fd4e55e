"""gRPC Checkpoints service: jobs report checkpoints here."""

from __future__ import annotations

import grpc

from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.preemption.core import CheckpointRecord, validate_report


class CheckpointsServicer(checkpoints_pb2_grpc.CheckpointsServicer):
    def __init__(self, registry: CheckpointRegistry) -> None:
        self.registry = registry

    async def Report(
        self, request: checkpoints_pb2.CheckpointReport, context: grpc.aio.ServicerContext
    ) -> checkpoints_pb2.CheckpointAck:
        completed = request.completed_at.seconds + request.completed_at.nanos / 1e9
        problems = validate_report(request.job.job_id, request.job.generation, request.uri, completed)
        if problems:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "; ".join(f"{f}: {p}" for f, p in problems))
        report = CheckpointRecord(request.job.job_id, request.job.generation, request.uri, request.step, completed)
        latest = await self.registry.record(report)
        return checkpoints_pb2.CheckpointAck(recorded=latest == report, latest_uri=latest.uri)
