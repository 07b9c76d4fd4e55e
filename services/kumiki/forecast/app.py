"""Forecast service wiring: history-warmed models, lifecycle consumer (exactly once), checkpoint reports' progress
consumer (at least once: it writes nothing but forecasts), gRPC Forecaster."""

from __future__ import annotations

import logging

import grpc

from kumiki.common.bus.topics import CHECKPOINTS, JOB_LIFECYCLE
from kumiki.common.contracts.v1 import forecast_pb2_grpc
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.forecast.adapters.grpc import ForecasterServicer
from kumiki.forecast.adapters.lifecycle import LifecycleHandler, load_history, load_open_jobs
from kumiki.forecast.adapters.progress import ProgressHandler
from kumiki.forecast.core import ForecastBook
from kumiki.forecast.models import build_default_forecaster

log = logging.getLogger(__name__)


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    assert runtime.pool is not None
    book = ForecastBook(build_default_forecaster())
    book.warm_start(await load_history(runtime.pool), await load_open_jobs(runtime.pool))
    log.info("forecaster warmed from history", extra={"jobs": book.learned, "open": len(book.open_jobs)})
    runtime.consume([JOB_LIFECYCLE], "kumiki-forecast", LifecycleHandler(book, runtime.producer), exactly_once=True)
    runtime.consume([CHECKPOINTS], "kumiki-forecast-progress", ProgressHandler(book, runtime.producer))
    forecast_pb2_grpc.add_ForecasterServicer_to_server(ForecasterServicer(book, runtime.pool), server)


SPEC = ServiceSpec(
    name="forecast",
    grpc_port=50052,
    http_port=8082,
    wire=wire,
    schema="forecast",
    migrations="kumiki.forecast.migrations",
    grpc_services=("kumiki.v1.Forecaster",),
)
