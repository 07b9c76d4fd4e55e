"""The forecast service's gRPC Forecaster over a real server on loopback and the real job history."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import grpc
import pytest

from kumiki.common.config import DatabaseSettings
from kumiki.common.contracts.v1 import common_pb2, forecast_pb2, forecast_pb2_grpc
from kumiki.common.db import apply_migrations, create_pool
from kumiki.forecast.adapters.grpc import ForecasterServicer
from kumiki.forecast.core import ForecastBook
from kumiki.forecast.models import build_default_forecaster


@pytest.fixture
async def service(
    database_settings: DatabaseSettings,
) -> AsyncIterator[tuple[forecast_pb2_grpc.ForecasterStub, asyncpg.Pool]]:
    pool = await create_pool(database_settings)
    await apply_migrations(pool, "forecast", "kumiki.forecast.migrations")
    server = grpc.aio.server()
    servicer = ForecasterServicer(ForecastBook(build_default_forecaster()), pool)
    forecast_pb2_grpc.add_ForecasterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield forecast_pb2_grpc.ForecasterStub(channel), pool
    await server.stop(None)
    await pool.close()


def busy_hour(hour_of_day: int) -> bool:
    return 9 <= hour_of_day < 18


async def test_demand_follows_the_daily_cycle_of_history(
    service: tuple[forecast_pb2_grpc.ForecasterStub, asyncpg.Pool],
) -> None:
    stub, pool = service
    now = time.time()
    this_hour = now - now % 3600
    rows = []
    for hours_ago in range(1, 4 * 24 + 1):  # four days: 6 jobs an hour in working hours, 1 otherwise
        start = this_hour - hours_ago * 3600
        hour_of_day = datetime.fromtimestamp(start, UTC).hour
        for index in range(6 if busy_hour(hour_of_day) else 1):
            submitted = datetime.fromtimestamp(start + 60 * index + 1, UTC)
            rows.append((f"vision-{hours_ago}-{index}", "vision", 2.0, submitted, 1800.0))
    rows.append(("lonely-1", "rare", 1.0, datetime.fromtimestamp(this_hour - 7200 + 5, UTC), None))
    await pool.executemany(
        "INSERT INTO forecast.job_history (job_id, generation, queue, gpus, submitted_at, runtime_s)"
        " VALUES ($1, 1, $2, $3, $4, $5)",
        rows,
    )
    reply = await stub.Demand(forecast_pb2.DemandRequest(horizon_hours=24))
    by_queue = {item.queue: item for item in reply.queues}
    assert set(by_queue) == {"vision", "rare"}
    vision = by_queue["vision"]
    assert vision.model == "holt-winters"
    assert len(vision.arrivals_per_hour) == len(vision.gpu_hours_per_hour) == 24
    hours = [datetime.fromtimestamp(this_hour + 3600 * step, UTC).hour for step in range(24)]
    busy = [v for v, h in zip(vision.arrivals_per_hour, hours, strict=True) if busy_hour(h)]
    quiet = [v for v, h in zip(vision.arrivals_per_hour, hours, strict=True) if not busy_hour(h)]
    assert min(busy) > 3 * max(quiet), "the forecast keeps the working-hours peak"
    assert math.isclose(sum(vision.gpu_hours_per_hour), sum(vision.arrivals_per_hour), rel_tol=0.25)  # 2 GPUs x 0.5 h
    assert by_queue["rare"].model == "mean"

    only = await stub.Demand(forecast_pb2.DemandRequest(queue="rare", horizon_hours=3))
    assert [item.queue for item in only.queues] == ["rare"]


async def test_invalid_requests_name_the_field(service: tuple[forecast_pb2_grpc.ForecasterStub, asyncpg.Pool]) -> None:
    stub, _ = service
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Demand(forecast_pb2.DemandRequest(horizon_hours=0))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "horizon_hours: must be 1..168, got 0"
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.Predict(forecast_pb2.PredictRequest(job=common_pb2.JobRef(job_id="j", generation=1), gpus=math.nan))
    assert error.value.details().startswith("gpus: must be a finite number >= 0")


async def test_predict_carries_the_calibrated_spread_once_there_is_one(database_settings: DatabaseSettings) -> None:
    """log_sigma and error_sigma are unset before the model has errors to calibrate on, then its own values."""
    from kumiki.sched.forecasting import JobFeatures

    pool = await create_pool(database_settings)
    forecaster = build_default_forecaster()
    server = grpc.aio.server()
    forecast_pb2_grpc.add_ForecasterServicer_to_server(ForecasterServicer(ForecastBook(forecaster), pool), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    request = forecast_pb2.PredictRequest(
        job=common_pb2.JobRef(job_id="next", generation=1), queue="team-a", user="alice", gpus=8, name="bert"
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = forecast_pb2_grpc.ForecasterStub(channel)
            cold = await stub.Predict(request)
            assert not cold.HasField("log_sigma") and not cold.HasField("error_sigma")
            for index in range(60):  # bert jobs of 0.5, 1 and 1.5 h: a spread to calibrate on
                job = JobFeatures(f"bert-{index}", "team-a", "alice", 8.0, "bert", 1000.0 + index)
                forecaster.observe(job, 1800.0 * (1 + index % 3), 5000.0 + 100 * index)
            warm = await stub.Predict(request)
    finally:
        await server.stop(None)
        await pool.close()
    assert warm.HasField("log_sigma") and 0 < warm.log_sigma < 2
    # the key's honest spread: its residuals' width and bias, what placement's preemption margin reads
    expected = forecaster.predict(JobFeatures("next", "team-a", "alice", 8.0, "bert", 7000.0)).error_sigma
    assert expected is not None and warm.HasField("error_sigma") and warm.error_sigma == pytest.approx(expected)
    assert warm.p50_s < warm.p90_s
