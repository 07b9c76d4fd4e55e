"""The commit watch on Apache Kafka, with telemetry's faust app in this process: while faust commits, the
watch is quiet; when faust's commits stop moving on job.lifecycle (its acknowledgement bookkeeping made to
hold them back, as an offset it never saw acknowledged does) while the agent goes on processing, the stall
becomes the service's crash reason naming the partition; a new worker reads the records again and commits."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS, JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.telemetry.adapters.commits import CommitStalled
from kumiki.telemetry.adapters.streams import TelemetryStreams
from kumiki.telemetry.core import TelemetryConfig
from tests.conftest import wait_until

pytestmark = [pytest.mark.kafka]

STALL_S = 2.0


def running(job: str, node: str) -> events_pb2.JobLifecycle:
    return events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job, generation=1),
        state=events_pb2.JOB_STATE_RUNNING,
        queue="team-a",
        assignments=[common_pb2.PodAssignment(node=node, gpu_indices=[0])],
        gpus=1,
    )


async def publish(producer: EventProducer, jobs: list[str]) -> None:
    await producer.publish_many(JOB_LIFECYCLE, [(job, running(job, f"node-{i}"), job) for i, job in enumerate(jobs)])


def lifecycle_caught_up(streams: TelemetryStreams) -> Callable[[], Any]:
    """True once the watch's last look found every job.lifecycle partition this worker holds committed to
    its end (and at least one such partition with records)."""
    topic = JOB_LIFECYCLE.full_name(streams.settings.topic_prefix)

    async def caught_up() -> bool:
        assert streams.commits is not None
        await streams.commits.check()
        mine = {tp: state for tp, state in streams.commits.progress.items() if tp.topic == topic}
        return bool(mine) and any(s.end for s in mine.values()) and all(s.behind == 0 for s in mine.values())

    return caught_up


async def test_a_commit_that_stops_moving_while_records_are_processed_becomes_the_crash_reason(
    kafka: KafkaSettings,
) -> None:
    settings = KafkaSettings(bootstrap=kafka.bootstrap, topic_prefix=kafka.topic_prefix, default_partitions=2)
    await ensure_topics(settings, ALL_TOPICS)
    config = TelemetryConfig(batch_window_s=0.01, session_timeout_s=6)
    topic = JOB_LIFECYCLE.full_name(settings.topic_prefix)
    async with EventProducer(settings, "//kumiki/test-commits") as producer:
        streams = TelemetryStreams(settings, config, producer, commit_stall_s=STALL_S)
        await streams.start()
        try:
            await streams.wait_recovered(60)
            first = [f"ok-{uuid.uuid4().hex[:6]}-{i}" for i in range(6)]
            await publish(producer, first)
            caught_up = lifecycle_caught_up(streams)
            await wait_until(caught_up, timeout_s=60, interval_s=0.3, what="faust to commit job.lifecycle")
            assert streams.crash_reason() is None
            assert all(streams.job_placements.get(job) for job in first)

            # faust's commits on job.lifecycle stop moving; its agent keeps processing
            consumer = streams.app.consumer
            commit_offset = consumer._new_offset
            consumer._new_offset = lambda tp: None if tp.topic == topic else commit_offset(tp)
            held = [f"held-{uuid.uuid4().hex[:6]}-{i}" for i in range(6)]
            await publish(producer, held)
            await wait_until(lambda: all(streams.job_placements.get(job) for job in held), timeout_s=60,
                             what="the agent to process the records it cannot commit")  # fmt: skip
            await wait_until(lambda: streams.crash_reason() is not None, timeout_s=60, what="the watch to see it")
            reason = streams.crash_reason()
            assert isinstance(reason, CommitStalled), reason
            text = str(reason)
            assert f"{topic}[" in text and "KUMIKI_TELEMETRY_COMMIT_STALL_S" in text and "faust: committed" in text
            assert f"group {streams.app_id}" in text
        finally:
            await streams.stop()

        # the restart: a new worker of the group reads the held records again and commits them
        again = TelemetryStreams(settings, config, producer, commit_stall_s=STALL_S)
        await again.start()
        try:
            await again.wait_recovered(60)
            caught_up = lifecycle_caught_up(again)
            await wait_until(caught_up, timeout_s=90, interval_s=0.3, what="the new worker to commit job.lifecycle")
            assert again.crash_reason() is None
            assert all(again.job_placements.get(job) for job in held)
        finally:
            await again.stop()
