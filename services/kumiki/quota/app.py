"""Quota service wiring."""

from __future__ import annotations

import grpc

from kumiki.common.contracts.v1 import quota_pb2_grpc
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.quota.adapters.grpc import QuotaServicer


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    quota_pb2_grpc.add_QuotaServicer_to_server(QuotaServicer(), server)


SPEC = ServiceSpec(name="quota", grpc_port=50053, http_port=8083, wire=wire, grpc_services=("kumiki.v1.Quota",))
