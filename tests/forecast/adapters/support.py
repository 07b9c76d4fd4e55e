"""What the forecast service's adapter tests share: the real service on the test's broker and database, the
lifecycle events placement would publish, and the forecasts read back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiokafka.structs import ConsumerRecord

from kumiki.common.config import DatabaseSettings, KafkaSettings, ServerSettings, Settings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.service import ServiceHost
from kumiki.forecast.app import SPEC as FORECAST


@asynccontextmanager
async def forecast_service(
    kafka: KafkaSettings, database: DatabaseSettings, instance: str = "f-1"
) -> AsyncIterator[ServiceHost]:
    """The forecast service (its consumers, gRPC server and Postgres schema), stopped on leaving."""
    host = ServiceHost(FORECAST, Settings("forecast", kafka, database, ServerSettings(), instance=instance))
    await host.start()
    try:
        yield host
    finally:
        await host.stop()


def lifecycle(
    job_id: str, state: events_pb2.JobState.ValueType, at_s: int, generation: int = 1, runtime_s: float = 0.0
) -> events_pb2.JobLifecycle:
    """A job.lifecycle event of an 8-GPU job of queue research, at whole second `at_s`."""
    message = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job_id, generation=generation),
        state=state,
        queue="research",
        user="ada",
        gpus=8.0,
        name="bert-pretrain",
        runtime_s=runtime_s,
    )
    message.at.seconds = at_s
    return message


def forecasts(records: list[ConsumerRecord]) -> list[events_pb2.RuntimeForecast]:
    return [events_pb2.RuntimeForecast.FromString(record.value) for record in records]
