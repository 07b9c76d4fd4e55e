"""gRPC Forecaster: run-time quantiles for a job on demand."""

from __future__ import annotations

import asyncio
import math
import time

import asyncpg
import grpc

from kumiki.common.contracts.v1 import forecast_pb2, forecast_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, abort_invalid, job_feature_fields, require_finite, require_job
from kumiki.forecast.adapters.lifecycle import load_arrivals
from kumiki.forecast.core import ForecastBook
from kumiki.forecast.demand import HOUR_S, MAX_HORIZON_HOURS, Arrival, forecast_queues, hourly_demand
from kumiki.sched.forecasting import JobFeatures

DEMAND_HISTORY_S = 14 * 24 * HOUR_S  # two weeks: enough for the daily season, cheap to fit


def features_from_request(request: forecast_pb2.PredictRequest) -> JobFeatures:
    require_job(request.job, generation=False)  # a forecast is per job, whatever its attempt
    require_finite("gpus", request.gpus)
    if not math.isfinite(request.submit_unix_s) or request.submit_unix_s < 0:
        raise InvalidRequest("submit_unix_s", f"must be >= 0, got {request.submit_unix_s}")
    image, command, time_limit_s = job_feature_fields(request)
    return JobFeatures(
        request.job.job_id,
        request.queue,
        request.user,
        request.gpus,
        request.name,
        request.submit_unix_s,
        image,
        command,
        time_limit_s,
    )


class ForecasterServicer(forecast_pb2_grpc.ForecasterServicer):
    def __init__(self, book: ForecastBook, pool: asyncpg.Pool | None = None) -> None:
        self.book = book
        self.pool = pool

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
            p50_s=forecast.p50_s,
            p90_s=forecast.p90_s,
            model=forecast.model,
            model_version=forecast.model_version,
            log_sigma=forecast.log_sigma,
            error_sigma=forecast.error_sigma,
        )

    async def Demand(
        self, request: forecast_pb2.DemandRequest, context: grpc.aio.ServicerContext
    ) -> forecast_pb2.DemandResponse:
        if not 1 <= request.horizon_hours <= MAX_HORIZON_HOURS:
            await abort_invalid(
                context, InvalidRequest("horizon_hours", f"must be 1..{MAX_HORIZON_HOURS}, got {request.horizon_hours}")
            )
        if self.pool is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "demand needs the job history database")
        assert self.pool is not None
        now_s = time.time()
        end_s = now_s - now_s % HOUR_S  # whole hours only: the current hour is still filling
        arrivals = await load_arrivals(self.pool, end_s - DEMAND_HISTORY_S, end_s, request.queue)
        by_queue: dict[str, list[Arrival]] = {}
        for arrival in arrivals:
            by_queue.setdefault(arrival.queue, []).append(arrival)
        demand = {}
        for queue_arrivals in by_queue.values():
            # a queue's history starts at its first recorded job: earlier hours are unknown, not zero demand
            first_s = min(arrival.submit_s for arrival in queue_arrivals)
            start_s = max(end_s - DEMAND_HISTORY_S, first_s - first_s % HOUR_S)
            demand.update(hourly_demand(queue_arrivals, start_s, end_s))
        # Holt-Winters fits take tens of milliseconds per queue: keep them off the event loop
        forecasts = await asyncio.to_thread(forecast_queues, demand, request.horizon_hours)
        return forecast_pb2.DemandResponse(
            queues=[
                forecast_pb2.QueueDemand(
                    queue=item.queue,
                    arrivals_per_hour=item.arrivals_per_hour.values,
                    gpu_hours_per_hour=item.gpu_hours_per_hour.values,
                    model=item.arrivals_per_hour.model,
                )
                for item in forecasts
            ]
        )
