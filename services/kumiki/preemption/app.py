"""Preemption service wiring: the checkpoint registry behind Checkpoints.Report."""

from __future__ import annotations

import grpc

from kumiki.common.contracts.v1 import checkpoints_pb2_grpc
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.preemption.adapters.grpc import CheckpointsServicer
from kumiki.preemption.adapters.registry import CheckpointRegistry


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    assert runtime.pool is not None
    checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(
        CheckpointsServicer(CheckpointRegistry(runtime.pool)), server
    )


SPEC = ServiceSpec(
    name="preemption",
    grpc_port=50054,
    http_port=8084,
    wire=wire,
    schema="preemption",
    migrations="kumiki.preemption.migrations",
    grpc_services=("kumiki.v1.Checkpoints",),
)
