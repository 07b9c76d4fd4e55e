"""Fixtures of the binder's tests: one real control plane for the session (etcd, kube-apiserver, KWOK), and
per test a clean cluster with placement and the binder as processes on their own Kafka topics."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from kumiki.common.config import KafkaSettings
from kumiki.devstack.kube import KubeBinaries, KubeStack, start_kube, stop_kube
from tests.binder.support import Processes, api_client, clean_cluster, install_crd


@pytest.fixture(scope="session")
def kube_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeStack]:
    binaries = KubeBinaries.from_env()
    missing = binaries.missing()
    if missing:
        pytest.skip(f"Kubernetes binaries not built ({', '.join(missing)}): run bash infra/kube/build.sh")
    stack = start_kube(tmp_path_factory.mktemp("kube"), binaries=binaries)
    try:
        yield stack
    finally:
        stop_kube(stack)


@pytest.fixture
async def kube(kube_stack: KubeStack) -> AsyncIterator:  # type: ignore[type-arg]
    client = api_client(kube_stack)
    await clean_cluster(client)
    await install_crd(client)
    try:
        yield client
    finally:
        await clean_cluster(client)
        await client.close()


@pytest.fixture
async def processes(kube_stack: KubeStack, kafka: KafkaSettings, tmp_path: Path) -> AsyncIterator[Processes]:
    running = Processes(kube_stack, kafka, tmp_path)
    try:
        yield running
    finally:
        running.stop()
        print(running.logs())  # pytest shows a test's output only when it failed
