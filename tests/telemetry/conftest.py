"""Fixtures of the telemetry tests that run agents and the service as processes (helpers in support.py)."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kumiki.common.bus import ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS
from kumiki.common.config import KafkaSettings
from tests.agent.fake_nvml.build import build_library
from tests.telemetry.support import Processes, Topics


@pytest.fixture(scope="module")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fake_nvml")
    build_library(folder)
    return folder


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    yield procs
    for name in list(procs.running):
        procs.stop(name, signal.SIGKILL)


@pytest.fixture
async def topics(kafka_settings: KafkaSettings) -> AsyncIterator[Topics]:
    await ensure_topics(kafka_settings, ALL_TOPICS)
    seen = Topics(kafka_settings)
    await seen._consumer.start()
    yield seen
    await seen._consumer.stop()
