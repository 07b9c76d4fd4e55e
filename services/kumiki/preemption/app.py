"""Preemption service wiring: the checkpoint registry behind Checkpoints, and the coordinator that runs the
CHECKPOINT → acknowledgement → EVICT → release and requeue → RESUME protocol for every victim placement names."""

from __future__ import annotations

import asyncio
import os

import grpc

from kumiki.common.bus.topics import JOB_LIFECYCLE, SCHEDULING_DECISIONS
from kumiki.common.config import ConfigError, env_float, env_optional
from kumiki.common.contracts.v1 import checkpoints_pb2_grpc
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.preemption.adapters.coordinator import Coordinator
from kumiki.preemption.adapters.grpc import CheckpointsServicer
from kumiki.preemption.adapters.identity import JobIdentity
from kumiki.preemption.adapters.registry import CheckpointRegistry


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    assert runtime.pool is not None
    placement = env_optional(os.environ, "KUMIKI_PLACEMENT_ADDRESS")
    if placement is not None and ":" not in placement:
        raise ConfigError(f"KUMIKI_PLACEMENT_ADDRESS: expected host:port, got {placement!r}")
    coordinator = Coordinator(
        runtime.pool,
        runtime.producer,
        placement_address=placement,
        deadline_s=env_float(os.environ, "KUMIKI_PREEMPTION_DEADLINE_S", 300.0, minimum=0.0, maximum=86400.0),
        grace_period_s=env_float(os.environ, "KUMIKI_PREEMPTION_GRACE_S", 30.0, minimum=0.0, maximum=86400.0),
        hold_s=env_float(os.environ, "KUMIKI_PREEMPTION_HOLD_S", 300.0, minimum=0.0, maximum=86400.0),
    )
    runtime.consume([SCHEDULING_DECISIONS], "preemption-decisions", coordinator.on_decision, exactly_once=True)
    runtime.consume([JOB_LIFECYCLE], "preemption-lifecycle", coordinator.on_lifecycle, exactly_once=True)
    runtime.background.append(asyncio.create_task(coordinator.run(runtime.stopping), name="preemption-coordinator"))
    runtime.closers.append(coordinator.close)
    runtime.components.update(coordinator=coordinator)
    identity = JobIdentity.from_env(os.environ)
    if identity is not None:
        runtime.closers.append(identity.close)
    checkpoints_pb2_grpc.add_CheckpointsServicer_to_server(
        CheckpointsServicer(CheckpointRegistry(runtime.pool), coordinator, identity), server
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
