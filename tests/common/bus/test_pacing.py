"""Pacing empty fetches: an idle consumer on a broker that answers them at once no longer spins."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.conn import AIOKafkaConnection
from aiokafka.consumer import fetcher as aiokafka_fetcher

from kumiki.common.bus import EventProducer
from kumiki.common.bus.admin import ensure_topics, start_client
from kumiki.common.bus.pacing import pace_empty_fetches, remaining_pause
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2

WINDOW_S = 1.0


def test_no_pause_after_a_long_poll_or_when_off() -> None:
    assert remaining_pause(0.5, 0.5, 0.05) == 0.0  # the broker held the fetch for the wait asked
    assert remaining_pause(0.5, 0.7, 0.05) == 0.0
    assert remaining_pause(0.5, 0.001, 0.0) == 0.0  # pacing off


def test_an_early_empty_answer_waits_at_most_the_pause_and_never_past_the_wait() -> None:
    assert remaining_pause(0.5, 0.001, 0.05) == pytest.approx(0.05)
    assert remaining_pause(0.5, 0.48, 0.05) == pytest.approx(0.02)


def test_the_fetcher_is_wrapped_once_and_pacing_can_be_turned_off() -> None:
    try:
        assert pace_empty_fetches(0.05)
        wrapped = aiokafka_fetcher.Fetcher._proc_fetch_request  # type: ignore[attr-defined]
        assert pace_empty_fetches(0.02)
        assert aiokafka_fetcher.Fetcher._proc_fetch_request is wrapped  # type: ignore[attr-defined]
        assert not pace_empty_fetches(0.0)
    finally:
        pace_empty_fetches(KafkaSettings().empty_fetch_pause_ms / 1000.0)


async def idle_fetches(settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> tuple[int, float, AIOKafkaConsumer]:
    """Fetch requests an assigned consumer sends on empty partitions for about WINDOW_S, and the seconds
    watched (the consumer is returned started, for the caller to use and stop)."""
    await ensure_topics(settings, [JOB_LIFECYCLE])
    sent = {"fetches": 0}
    send = AIOKafkaConnection.send

    def counting_send(self: AIOKafkaConnection, request: Any, expect_response: bool = True) -> Any:
        if type(request).__name__.startswith("FetchRequest"):
            sent["fetches"] += 1
        return send(self, request, expect_response)

    consumer = AIOKafkaConsumer(**settings.client_options(), group_id=None, enable_auto_commit=False)
    await start_client(consumer, settings)  # installs the pacing the settings ask for
    topic = JOB_LIFECYCLE.full_name(settings.topic_prefix)
    partitions = [TopicPartition(topic, index) for index in range(settings.default_partitions)]
    consumer.assign(partitions)
    await consumer.seek_to_end(*partitions)
    await consumer.getmany(timeout_ms=200)
    monkeypatch.setattr(AIOKafkaConnection, "send", counting_send)
    started = time.monotonic()
    while time.monotonic() - started < WINDOW_S:
        assert not await consumer.getmany(timeout_ms=100)
    watched_s = time.monotonic() - started
    monkeypatch.setattr(AIOKafkaConnection, "send", send)
    return sent["fetches"], watched_s, consumer


async def test_an_idle_consumer_sends_few_fetches_and_still_reads_what_arrives(
    kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetches, watched_s, consumer = await idle_fetches(kafka_settings, monkeypatch)
    try:
        pause_s = kafka_settings.empty_fetch_pause_ms / 1000.0
        # at most one fetch per pause (one broker, one node, one fetch in flight at the start); a long-polling
        # broker sends about two a second
        assert fetches <= watched_s / pause_s + 2
        job = events_pb2.JobLifecycle(
            job=common_pb2.JobRef(job_id="paced", generation=1), state=events_pb2.JOB_STATE_SUBMITTED, queue="a"
        )
        async with EventProducer(kafka_settings, "//kumiki/test") as producer:
            await producer.publish(JOB_LIFECYCLE, "paced", job)
        deadline = time.monotonic() + 30
        records: list[Any] = []
        while not records and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
        assert len(records) == 1
    finally:
        await consumer.stop()
        pace_empty_fetches(KafkaSettings().empty_fetch_pause_ms / 1000.0)


async def test_without_pacing_the_development_broker_is_fetched_from_without_pause(
    noida_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the pacing is for: noida-db answers empty fetches at once, so an unpaced consumer spins."""
    settings = dataclasses.replace(
        KafkaSettings(bootstrap=noida_bootstrap, topic_prefix="test-unpaced."), empty_fetch_pause_ms=0
    )
    fetches, watched_s, consumer = await idle_fetches(settings, monkeypatch)
    await consumer.stop()
    pace_empty_fetches(KafkaSettings().empty_fetch_pause_ms / 1000.0)
    assert fetches > 3 * (watched_s / 0.05 + 2)  # three times what the default pacing allows
