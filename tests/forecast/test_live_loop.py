"""The forecasting loop across live services: placement announces a job that has to wait (SUBMITTED on
job.lifecycle) and one it binds at once (BOUND), the forecast service forecasts both on job.forecast; placement
reports how jobs ended (Release with COMPLETED and the run time since the bind) and the forecast service records
and learns those run times."""

from __future__ import annotations

import time

import asyncpg
import pytest

from kumiki.common.bus.topics import JOB_FORECAST
from kumiki.common.config import DatabaseSettings, KafkaSettings, ServerSettings, Settings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2
from kumiki.common.service import ServiceHost
from kumiki.devstack.cluster import NodeShape, emulated_nodes
from kumiki.forecast.app import SPEC as FORECAST
from tests.conftest import read_records, wait_until
from tests.placement.support import bind_request, emulate, running_placement, whole

pytestmark = pytest.mark.slow


async def test_placement_and_forecast_close_the_loop(kafka: KafkaSettings, database_settings: DatabaseSettings) -> None:
    started = time.monotonic()
    await emulate(kafka, emulated_nodes(1, shapes=(NodeShape("H100-80GB", 8, 81920, 8, 96_000, 1_048_576),)))
    forecast = ServiceHost(FORECAST, Settings("forecast", kafka, database_settings, ServerSettings(), instance="f-1"))
    await forecast.start()
    try:
        async with running_placement(kafka) as (host, stub):
            assert host.runtime is not None
            book = host.runtime.components["book"]
            await wait_until(lambda: len(book.nodes) == 1, what="the node")  # type: ignore[attr-defined]
            blocker = await stub.Bind(bind_request("blocker", [whole(8)], name="bert-pretrain"))
            # the features a pod carries travel with the job: the forecast never exceeds the time it asked for
            waits = await stub.Bind(
                bind_request(
                    "waits",
                    [whole(8)],
                    name="bert-pretrain",
                    image="registry.example/nlp/bert:7",
                    command="python pretrain.py --config base.yaml",
                    time_limit_s=60.0,
                )
            )
            assert (blocker.outcome, waits.outcome) == (
                placement_pb2.BindResponse.OUTCOME_BOUND,
                placement_pb2.BindResponse.OUTCOME_PENDING,
            )
            records = await read_records(kafka, JOB_FORECAST.full_name(kafka.topic_prefix), 2)
            forecasts = {
                forecast.job.job_id: forecast
                for forecast in (events_pb2.RuntimeForecast.FromString(record.value) for record in records)
            }
            assert set(forecasts) == {"blocker", "waits"}, "the job bound at once is forecast at its bind"
            forecast_of_waiting = forecasts["waits"]
            assert 0 < forecast_of_waiting.p50_s <= forecast_of_waiting.p90_s and forecast_of_waiting.model
            assert forecast_of_waiting.p90_s <= 60.0, "a cold forecast (half an hour) is capped at the time limit"
            for job in ("blocker", "waits"):
                if job == "waits":  # the cycle starts it once the blocker's GPUs are free

                    async def bound() -> bool:
                        explained = await stub.Explain(placement_pb2.ExplainRequest(job_id="waits"))
                        return explained.status == "bound"

                    await wait_until(bound, what="the waiting job to start")
                await stub.Release(
                    placement_pb2.ReleaseRequest(
                        job=common_pb2.JobRef(job_id=job, generation=1), final_state=events_pb2.JOB_STATE_COMPLETED
                    )
                )
        pool = forecast.runtime.pool  # type: ignore[union-attr]
        assert isinstance(pool, asyncpg.Pool)

        async def learned() -> list[asyncpg.Record]:
            rows = await pool.fetch(
                "SELECT job_id, final_state, runtime_s, p50_s, submitted_at, started_at, finished_at, image, command,"
                " time_limit_s"
                " FROM forecast.job_history ORDER BY job_id"
            )
            return rows if [row["job_id"] for row in rows if row["runtime_s"]] == ["blocker", "waits"] else []

        await wait_until(learned, what="both completions in the forecast service's history")
        rows = {row["job_id"]: row for row in await learned()}
        assert {row["final_state"] for row in rows.values()} == {"completed"}
        assert rows["waits"]["p50_s"] == pytest.approx(forecast_of_waiting.p50_s), "its forecast was recorded"
        waits_features = (rows["waits"]["image"], rows["waits"]["command"], rows["waits"]["time_limit_s"])
        assert waits_features == ("registry.example/nlp/bert:7", "python pretrain.py --config base.yaml", 60.0)
        assert (rows["blocker"]["image"], rows["blocker"]["time_limit_s"]) == ("", None), "none asked, none kept"
        blocker = rows["blocker"]  # never queued: first seen at its bind, which is when it was submitted and started
        assert blocker["submitted_at"] == blocker["started_at"]
        assert blocker["p50_s"] == pytest.approx(forecasts["blocker"].p50_s)
        run_s = (blocker["finished_at"] - blocker["started_at"]).total_seconds()
        assert blocker["runtime_s"] == pytest.approx(run_s, abs=0.5), "its run time is since its bind"
        assert all(0 < row["runtime_s"] < time.monotonic() - started for row in rows.values()), "run times since binds"
    finally:
        await forecast.stop()
