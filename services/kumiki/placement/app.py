"""Placement service wiring."""

from __future__ import annotations

import grpc

from kumiki.common.contracts.v1 import placement_pb2_grpc
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.placement.adapters.grpc import PlacementServicer


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    placement_pb2_grpc.add_PlacementServicer_to_server(PlacementServicer(), server)


SPEC = ServiceSpec(name="placement", grpc_port=50051, http_port=8081, wire=wire, grpc_services=("kumiki.v1.Placement",))
