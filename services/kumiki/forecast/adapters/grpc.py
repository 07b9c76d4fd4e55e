"""gRPC Forecaster: run-time quantiles for a job on demand."""

from __future__ import annotations

import math

import grpc

from kumiki.common.contracts.v1 import forecast_pb2, forecast_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, abort_invalid
from kumiki.forecast.core import ForecastBook
from kumiki.sched.forecasting import JobFeatures


def features_from_request(request: forecast_pb2.PredictRequest) -> JobFeatures:
    if not request.job.job_id:
        raise InvalidRequest("job.job_id", "required")
    if not math.isfinite(request.gpus) or request.gpus < 0:
        raise InvalidRequest("gpus", f"must be a finite number >= 0, got {request.gpus}")
    if not math.isfinite(request.submit_unix_s) or request.submit_unix_s < 0:
        raise InvalidRequest("submit_unix_s", f"must be >= 0, got {request.submit_unix_s}")
    return JobFeatures(
        request.job.job_id, request.queue, request.user, request.gpus, request.name, request.submit_unix_s
    )


class ForecasterServicer(forecast_pb2_grpc.ForecasterServicer):
    def __init__(self, book: ForecastBook) -> None:
        self.book = book

    async def Predict(
        self, request: forecast_pb2.PredictRequest, context: grpc.aio.ServicerContext
    ) -> forecast_pb2.PredictResponse:
        try:
            features = features_from_request(request)
        except InvalidRequest as error:
            await abort_invalid(context, error)
            raise
        forecast = self.book.forecaster.predict(features)
        return forecast_pb2.PredictResponse(
            p50_s=forecast.p50_s, p90_s=forecast.p90_s, model=forecast.model, model_version=forecast.model_version
        )

    async def Demand(
        self, request: forecast_pb2.DemandRequest, context: grpc.aio.ServicerContext
    ) -> forecast_pb2.DemandResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "demand forecasting over gRPC is not in this build yet; use `kumiki forecast demand`",
        )
        raise AssertionError("unreachable")
