"""gRPC Quota. Requests are validated here; admission and the ledger arrive with the quota issue."""

from __future__ import annotations

import grpc

from kumiki.common.contracts.v1 import quota_pb2, quota_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, abort_invalid
from kumiki.quota.core import validate_admit

NOT_YET = "queue quotas and the GPU-hour ledger are not in this build yet (tracked by the quota service issue)"


class QuotaServicer(quota_pb2_grpc.QuotaServicer):
    async def Admit(
        self, request: quota_pb2.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> quota_pb2.AdmitResponse:
        try:
            validate_admit(request)
        except InvalidRequest as error:
            await abort_invalid(context, error)
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_YET)
        raise AssertionError("unreachable")

    async def Usage(
        self, request: quota_pb2.UsageRequest, context: grpc.aio.ServicerContext
    ) -> quota_pb2.UsageResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, NOT_YET)
        raise AssertionError("unreachable")
