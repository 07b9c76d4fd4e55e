"""gRPC Placement. Requests are validated here; binding over live state arrives with the placement issue."""

from __future__ import annotations

import grpc

from kumiki.common.contracts.v1 import placement_pb2, placement_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, abort_invalid
from kumiki.placement.core import validate_bind

NOT_YET = "placement over live cluster state is not in this build yet (tracked by the placement service issue)"


class PlacementServicer(placement_pb2_grpc.PlacementServicer):
    async def Bind(
        self, request: placement_pb2.BindRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.BindResponse:
        try:
            validate_bind(request)
        except InvalidRequest as error:
            await abort_invalid(context, error)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_YET)
        raise AssertionError("unreachable")

    async def Release(
        self, request: placement_pb2.ReleaseRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ReleaseResponse:
        if not request.job.job_id:
            await abort_invalid(context, InvalidRequest("job.job_id", "required"))
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_YET)
        raise AssertionError("unreachable")

    async def Explain(
        self, request: placement_pb2.ExplainRequest, context: grpc.aio.ServicerContext
    ) -> placement_pb2.ExplainResponse:
        if not request.job_id:
            await abort_invalid(context, InvalidRequest("job_id", "required"))
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_YET)
        raise AssertionError("unreachable")
