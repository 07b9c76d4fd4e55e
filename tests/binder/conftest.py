"""Fixtures of the binder's tests: the control plane (`kube_stack`, `kube`: a clean cluster) comes from
tests/conftest.py (tests/observability uses it too); per test, placement and the binder as processes on their
own Kafka topics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kumiki.common.config import KafkaSettings
from kumiki.devstack.kube import KubeStack
from tests.binder.support import Processes


@pytest.fixture
async def processes(kube_stack: KubeStack, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Processes]:
    running = Processes(kube_stack, kafka, tmp_path)
    try:
        yield running
    finally:
        running.stop()
        print(running.logs())  # pytest shows a test's output only when it failed
