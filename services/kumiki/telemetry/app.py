"""Telemetry ingest wiring: consumes gpu.samples (no database; gRPC serves health only)."""

from __future__ import annotations

import grpc

from kumiki.common.bus.topics import GPU_SAMPLES
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.telemetry.adapters.samples import SampleHandler
from kumiki.telemetry.core import FleetUtilisation


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    runtime.consume([GPU_SAMPLES], "kumiki-telemetry-ingest", SampleHandler(FleetUtilisation()))


SPEC = ServiceSpec(name="telemetry-ingest", grpc_port=50055, http_port=8085, wire=wire)
