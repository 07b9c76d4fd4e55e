"""An evicted attempt that also completes at the same moment ends exactly once (placement in-process over real
gRPC and Apache Kafka, `kumiki` policy). Found by the live replay: the coordinator's Release(PREEMPTED) was
publishing PREEMPTED and the next generation's SUBMITTED when the driver's Release(COMPLETED) for the same
attempt came in; both were published, and the job then completed twice (generation 1, and generation 2)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiokafka import AIOKafkaConsumer

from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.service import ServiceHost
from kumiki.devstack.cluster import emulated_nodes
from kumiki.placement.core import BindCommand
from tests.conftest import wait_until
from tests.placement.support import bind_request, emulate, running_placement, whole
from tests.preemption.support import H100

pytestmark = pytest.mark.slow

ENDINGS = {events_pb2.JOB_STATE_PREEMPTED, events_pb2.JOB_STATE_COMPLETED}


@asynccontextmanager
async def preemptive(kafka: KafkaSettings) -> AsyncIterator[tuple[ServiceHost, placement_pb2_grpc.PlacementStub]]:
    await emulate(kafka, emulated_nodes(2, shapes=(H100,)))
    saved = {name: os.environ.get(name) for name in ("KUMIKI_PLACEMENT_POLICY", "KUMIKI_PLACEMENT_MIN_RUN_S")}
    os.environ.update(KUMIKI_PLACEMENT_POLICY="kumiki", KUMIKI_PLACEMENT_MIN_RUN_S="0")
    try:
        async with running_placement(kafka) as (host, stub):
            yield host, stub
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


async def endings(kafka: KafkaSettings, job: str) -> list[tuple[int, int]]:
    consumer = AIOKafkaConsumer(
        f"{kafka.topic_prefix}job.lifecycle",
        **kafka.client_options(),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    try:
        events = []
        while batch := await consumer.getmany(timeout_ms=1000):
            for records in batch.values():
                events += [events_pb2.JobLifecycle.FromString(record.value) for record in records]
    finally:
        await consumer.stop()
    return [(e.job.generation, e.state) for e in events if e.job.job_id == job and e.state in ENDINGS]


@pytest.mark.parametrize("first", ["preempted", "completed"])
async def test_an_attempt_released_as_preempted_and_completed_at_once_ends_exactly_once(
    kafka: KafkaSettings, first: str
) -> None:
    async with preemptive(kafka) as (_, stub):
        bound = placement_pb2.BindResponse.OUTCOME_BOUND
        assert (await stub.Bind(bind_request("team/filler", [whole(8)]))).outcome == bound
        assert (await stub.Bind(bind_request("team/train", [whole(4)], preemptible=True))).outcome == bound
        urgent = await stub.Bind(bind_request("team/urgent", [whole(8)], priority_tier=1))
        assert urgent.reasons[0].resource == "preemption"  # the training job is the victim, still running

        attempt = common_pb2.JobRef(job_id="team/train", generation=1)
        preempted = placement_pb2.ReleaseRequest(job=attempt, final_state=events_pb2.JOB_STATE_PREEMPTED)
        completed = placement_pb2.ReleaseRequest(job=attempt, final_state=events_pb2.JOB_STATE_COMPLETED)
        calls = [stub.Release(preempted), stub.Release(completed)]
        if first == "completed":
            calls.reverse()
        answers = await asyncio.gather(*calls)
        assert sorted(answer.released for answer in answers) == [False, True]  # one of them, never both

        found = await wait_until(lambda: endings(kafka, "team/train"), timeout_s=30, what="the attempt's end")
        assert len(found) == 1 and found[0][0] == 1, found
        if found[0][1] == events_pb2.JOB_STATE_PREEMPTED:  # evicted: the next generation waits to run
            assert (await stub.Explain(placement_pb2.ExplainRequest(job_id="team/train"))).status == "pending"

        async def urgent_bound() -> bool:  # the urgent job gets the freed GPUs either way
            explained = await stub.Explain(placement_pb2.ExplainRequest(job_id="team/urgent"))
            return explained.status == "bound"

        await wait_until(urgent_bound, timeout_s=30, what="the urgent job bound")


class SlowQuota:
    """Quota taking its time over the next generation (timing only: it admits everything once let go)."""

    def __init__(self) -> None:
        self.asked, self.answer = asyncio.Event(), asyncio.Event()

    async def admit(self, command: BindCommand) -> str | None:
        if command.generation > 1:
            self.asked.set()
            await self.answer.wait()
        return None


async def test_a_completion_while_quota_is_asked_for_the_next_generation_loses_to_the_eviction(
    kafka: KafkaSettings,
) -> None:
    """Placement asks quota for generation 2 inside the release (PREEMPTED ended generation 1's admission). The
    driver's Release(COMPLETED) arriving meanwhile must not end generation 1 a second time; found by the live
    replay (`kumiki up`: "ended more than once") when the ask came after the claim on the attempt was dropped."""
    async with preemptive(kafka) as (host, stub):
        bound = placement_pb2.BindResponse.OUTCOME_BOUND
        assert (await stub.Bind(bind_request("team/filler", [whole(8)]))).outcome == bound
        assert (await stub.Bind(bind_request("team/train", [whole(4)], preemptible=True))).outcome == bound
        await stub.Bind(bind_request("team/urgent", [whole(8)], priority_tier=1))
        assert host.runtime is not None
        slow = SlowQuota()
        host.runtime.components["servicer"].admission = slow

        attempt = common_pb2.JobRef(job_id="team/train", generation=1)
        evicting = asyncio.ensure_future(
            stub.Release(placement_pb2.ReleaseRequest(job=attempt, final_state=events_pb2.JOB_STATE_PREEMPTED))
        )
        await asyncio.wait_for(slow.asked.wait(), timeout=30)  # PREEMPTED is out; quota is asked for generation 2
        completed = await stub.Release(
            placement_pb2.ReleaseRequest(job=attempt, final_state=events_pb2.JOB_STATE_COMPLETED)
        )
        slow.answer.set()
        assert (await evicting).released and not completed.released

        found = await wait_until(lambda: endings(kafka, "team/train"), timeout_s=30, what="the attempt's end")
        assert found == [(1, events_pb2.JOB_STATE_PREEMPTED)]
