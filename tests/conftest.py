"""Real infrastructure for the tests: Apache Kafka and Postgres started by .ci/run (infra/ci/test.sh), and
the pip-installed development broker (noida-db) started here, so bus behaviour is checked on both.

KUMIKI_TEST_KAFKA_BOOTSTRAP and KUMIKI_TEST_DATABASE_URL name the Apache Kafka broker and the Postgres
server; a test that needs one that is not configured is skipped with the reason (CI configures both).
"""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.taskdump import print_tasks
from kumiki.devstack.broker import start_noida
from kumiki.devstack.processes import free_port, terminate

REPO_ROOT = Path(__file__).resolve().parents[1]


def apache_kafka_bootstrap() -> str | None:
    return os.environ.get("KUMIKI_TEST_KAFKA_BOOTSTRAP") or None


@pytest.fixture(scope="session")
def noida_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("noida")
    try:
        broker = start_noida(folder / "data", free_port(), folder / "noida.log")
    except Exception as error:  # the development broker is optional on a machine without the [local] extra
        pytest.skip(f"development broker unavailable: {error}")
    yield broker.bootstrap
    terminate(broker.pid)


@pytest.fixture(params=["kafka", "noida"])
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def kafka_settings(broker_kind: str, request: pytest.FixtureRequest) -> KafkaSettings:
    """Settings with a topic prefix unique to the test, so tests never see each other's records."""
    if broker_kind == "kafka":
        bootstrap = apache_kafka_bootstrap()
        if bootstrap is None:
            pytest.skip("KUMIKI_TEST_KAFKA_BOOTSTRAP not set (CI starts Apache Kafka)")
        idempotent = True
    else:
        bootstrap = request.getfixturevalue("noida_bootstrap")
        idempotent = True
    return KafkaSettings(
        bootstrap=bootstrap,
        topic_prefix=f"test-{uuid.uuid4().hex[:10]}.",
        idempotent_producer=idempotent,
        default_partitions=3,
    )


@pytest.fixture
def kafka() -> KafkaSettings:
    """Apache Kafka only, with a topic prefix unique to the test (for tests whose subject is not the broker)."""
    bootstrap = apache_kafka_bootstrap()
    if bootstrap is None:
        pytest.skip("KUMIKI_TEST_KAFKA_BOOTSTRAP not set (CI starts Apache Kafka)")
    return KafkaSettings(bootstrap=bootstrap, topic_prefix=f"test-{uuid.uuid4().hex[:10]}.")


@pytest.fixture(scope="session")
def postgres_admin_url() -> str:
    url = os.environ.get("KUMIKI_TEST_DATABASE_URL")
    if not url:
        pytest.skip("KUMIKI_TEST_DATABASE_URL not set (CI starts Postgres)")
    return url


@pytest.fixture
async def database_settings(postgres_admin_url: str) -> AsyncIterator[DatabaseSettings]:
    """A fresh database for the test, dropped afterwards."""
    name = f"test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, _ = postgres_admin_url.rpartition("/")
    yield DatabaseSettings(url=f"{base}/{name}", pool_min=1, pool_max=8)
    admin = await asyncpg.connect(postgres_admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(autouse=True)
def asyncio_task_dump_on_hang(request: pytest.FixtureRequest) -> Iterator[None]:
    """For async tests: after 240 s print every asyncio task's stack (pytest-timeout ends the test at 300 s
    but can only show threads, and a hung coroutine is a task, not a thread)."""
    if not asyncio.iscoroutinefunction(getattr(request, "function", None)):
        yield
        return
    import threading

    fired = threading.Event()

    def dump() -> None:
        fired.set()
        loop = getattr(request.node, "_kumiki_loop", None)
        print_tasks(loop, sys.stderr, header=f"{request.node.nodeid} still running after 240 s; asyncio tasks")

    timer = threading.Timer(240, dump)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()


@pytest.fixture(autouse=True)
async def _remember_loop(request: pytest.FixtureRequest) -> None:
    request.node._kumiki_loop = asyncio.get_running_loop()


async def wait_until(predicate, timeout_s: float = 60.0, interval_s: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    """Poll an async or plain predicate until it is truthy; fail with `what` after the timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)


def metric_samples(port: int) -> list[Sample]:
    """Every sample a service's /metrics on loopback serves now ([] while it does not answer yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:  # URLError, ConnectionRefusedError: not listening yet
        return []
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


async def read_records(
    settings: KafkaSettings,
    topics: str | Sequence[str],
    count: int,
    timeout_s: float = 30.0,
    until: Callable[[list[ConsumerRecord]], bool] | None = None,
) -> list[ConsumerRecord]:
    """At least `count` records of one topic or several, from the beginning (raw: tests check bytes, headers,
    keys), or with `until`, as many as it takes for `until(records)` to hold; fails naming the topics."""
    names = [topics] if isinstance(topics, str) else list(topics)
    consumer = AIOKafkaConsumer(
        *names, **settings.client_options(), auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:

        async def enough() -> bool:
            for items in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(items)
            return until(records) if until is not None else len(records) >= count

        await wait_until(enough, timeout_s=timeout_s, what=f"{count} records on {', '.join(names)}")
    finally:
        await consumer.stop()
    return records


# ---- a real control plane (etcd, kube-apiserver, KWOK), shared by tests/binder and tests/observability ----


@pytest.fixture(scope="session")
def kube_stack(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One control plane for the session (skipped when infra/kube/build.sh has not built the binaries)."""
    from kumiki.devstack.kube import KubeBinaries, start_kube, stop_kube

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
async def kube(kube_stack):  # type: ignore[no-untyped-def]
    """A clean cluster (no pods, no nodes) with the PodGroup CRD, and a lightkube client to it."""
    from tests.binder.support import api_client, clean_cluster, install_crd

    client = api_client(kube_stack)
    await clean_cluster(client)
    await install_crd(client)
    try:
        yield client
    finally:
        await clean_cluster(client)
        await client.close()
