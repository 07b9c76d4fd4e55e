"""The quota service's shell: start-up refusal without authentication, the token file, mTLS identities, and
the publishers (reclaim decisions and quota.state) on the real Kafka."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from prometheus_client import REGISTRY

from kumiki.common.bus import EventProducer, ensure_topics
from kumiki.common.bus.topics import CLUSTER_STATE, JOB_LIFECYCLE, QUOTA_STATE, SCHEDULING_DECISIONS
from kumiki.common.config import ConfigError, DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, quota_pb2, quota_pb2_grpc
from kumiki.devstack.processes import free_port
from kumiki.quota.adapters.auth import Authenticator, QuotaSettings, token_digest
from kumiki.quota.adapters.grpc import QuotaServicer
from kumiki.quota.adapters.publisher import Publisher
from kumiki.quota.adapters.store import QuotaStore, write_config
from kumiki.quota.core import AdmitRequest, parse_config
from tests.conftest import REPO_ROOT, metric_samples, read_records, wait_until
from tests.quota.helpers import TOKENS, admit_request, bearer, migrated_pool, tree


def test_refuses_to_start_without_caller_authentication() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")}
    env["PYTHONPATH"] = f"{REPO_ROOT / 'services'}:{REPO_ROOT}"
    result = subprocess.run([sys.executable, "-m", "kumiki.quota"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("kumiki-quota: configuration error: KUMIKI_QUOTA_TOKENS_FILE:")
    assert "KUMIKI_QUOTA_ALLOW_ANONYMOUS=true" in result.stderr


def test_token_file_is_validated_and_holds_only_digests(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plain-token: alice\n")
    with pytest.raises(ConfigError, match="KUMIKI_QUOTA_TOKENS_FILE: key 'plain-token'"):
        QuotaSettings.from_env({"KUMIKI_QUOTA_TOKENS_FILE": str(bad)})
    good = tmp_path / "tokens.yaml"
    good.write_text(f"{token_digest('s3cret')}: alice\n")
    settings = QuotaSettings.from_env({"KUMIKI_QUOTA_TOKENS_FILE": str(good)})
    assert settings.tokens == {token_digest("s3cret"): "alice"}
    assert "s3cret" not in good.read_text()
    assert QuotaSettings.from_env({"KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true"}).allow_anonymous


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_certificates(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and two client certificates (CN alice and mallory)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", str(folder / "ca.key"), "-out", str(folder / "ca.crt"))  # fmt: skip
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("alice", None), ("mallory", None)):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(folder / f"{name}.key"), "-out", str(folder / f"{name}.csr"))  # fmt: skip
        args = ["x509", "-req", "-in", str(folder / f"{name}.csr"), "-CA", str(folder / "ca.crt"), "-days", "1",
                "-CAkey", str(folder / "ca.key"), "-CAcreateserial", "-out", str(folder / f"{name}.crt")]  # fmt: skip
        if extra:
            (folder / f"{name}.ext").write_text(extra + "\n")
            args += ["-extfile", str(folder / f"{name}.ext")]
        openssl(*args)


@pytest.mark.postgres
async def test_mtls_common_name_is_the_identity(database_settings: DatabaseSettings, tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    make_certificates(tmp_path)
    pool = await migrated_pool(database_settings)
    await write_config(pool, parse_config(tree()), "test")
    server = grpc.aio.server()
    quota_pb2_grpc.add_QuotaServicer_to_server(
        QuotaServicer(QuotaStore(pool), Authenticator(QuotaSettings(mtls=True))), server
    )
    credentials = grpc.ssl_server_credentials(
        [((tmp_path / "server.key").read_bytes(), (tmp_path / "server.crt").read_bytes())],
        root_certificates=(tmp_path / "ca.crt").read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    await server.start()
    try:
        for client, allowed in (("alice", True), ("mallory", False)):
            channel_credentials = grpc.ssl_channel_credentials(
                root_certificates=(tmp_path / "ca.crt").read_bytes(),
                private_key=(tmp_path / f"{client}.key").read_bytes(),
                certificate_chain=(tmp_path / f"{client}.crt").read_bytes(),
            )
            async with grpc.aio.secure_channel(f"127.0.0.1:{port}", channel_credentials) as channel:
                stub = quota_pb2_grpc.QuotaStub(channel)
                if allowed:
                    reply = await stub.Admit(admit_request(f"{client}-job", "org/team-a", 2))
                    assert reply.admitted
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as error:
                        await stub.Admit(admit_request(f"{client}-job", "org/team-a", 2))
                    assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
                    assert error.value.details() == "queue org/team-a: 'mallory' is not one of its owners"
        identities = await pool.fetch("SELECT identity FROM quota.holdings")
        assert [row["identity"] for row in identities] == ["alice"]
    finally:
        await server.stop(None)
        await pool.close()


async def read_topic(kafka: KafkaSettings, topic: str, count: int) -> list[bytes]:
    return [record.value for record in await read_records(kafka, topic, count)]


@pytest.mark.kafka
@pytest.mark.postgres
async def test_publishes_reclaim_decisions_and_quota_state(
    kafka_settings: KafkaSettings, database_settings: DatabaseSettings, broker_kind: str
) -> None:
    if broker_kind == "noida":
        pytest.skip("the publishers are broker-agnostic; checked on Apache Kafka")
    await ensure_topics(kafka_settings, [SCHEDULING_DECISIONS, QUOTA_STATE])
    pool = await migrated_pool(database_settings)
    await write_config(pool, parse_config(tree(capacity=16)), "test")
    store = QuotaStore(pool)
    for index in range(16):
        await store.admit(AdmitRequest(f"b-{index}", 1, "org/batch", 1, preemptible=True), "erin")
    result = await store.admit(AdmitRequest("needs-2", 1, "org/team-a", 2), "alice")
    assert [victim.job_id for victim in result.victims] == ["b-15", "b-14"]
    async with EventProducer(kafka_settings, "//kumiki/quota-test") as producer:
        publisher = Publisher(store, producer, asyncio.Event(), interval_s=1.0, half_life_s=3600.0)
        assert await publisher.publish_reclaims() == 2
        assert await publisher.publish_reclaims() == 0  # marked published in the outbox
        assert await publisher.publish_states() == 5
        assert await publisher.publish_states() == 0  # unchanged: nothing republished
    decisions = [
        events_pb2.SchedulingDecision.FromString(value)
        for value in await read_topic(kafka_settings, SCHEDULING_DECISIONS.full_name(kafka_settings.topic_prefix), 2)
    ]
    assert sorted(d.job.job_id for d in decisions) == ["b-14", "b-15"]
    assert {d.kind for d in decisions} == {events_pb2.DECISION_KIND_RECLAIM}
    assert {d.beneficiary.job_id for d in decisions} == {"needs-2"}
    states = {
        state.queue: state
        for state in (
            events_pb2.QuotaState.FromString(value)
            for value in await read_topic(kafka_settings, QUOTA_STATE.full_name(kafka_settings.topic_prefix), 5)
        )
    }
    assert states["org/batch"].borrowed_gpus == 16 and states["org/batch"].used_gpus == 16
    assert states["org/team-a"].used_gpus == 2 and states["org/team-a"].guaranteed_gpus == 10
    # 16 borrowed: 6 from unguaranteed capacity, the rest from team-a's unused guarantee (8 of its 10)
    assert states["org/team-a"].lent_gpus == pytest.approx(8.0)
    assert states["org/team-a"].fair_share_gpus >= 2
    for queue, state in states.items():  # the gauges say what quota.state says
        gauge = {
            kind: REGISTRY.get_sample_value("kumiki_quota_queue_gpus", {"queue": queue, "kind": kind})
            for kind in ("guaranteed", "used", "borrowed", "lent")
        }
        assert gauge == {
            "guaranteed": state.guaranteed_gpus,
            "used": state.used_gpus,
            "borrowed": state.borrowed_gpus,
            "lent": pytest.approx(state.lent_gpus),
        }, queue
    await pool.close()


@pytest.mark.kafka
@pytest.mark.postgres
async def test_service_process_end_to_end(
    kafka_settings: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path, broker_kind: str
) -> None:
    """`python -m kumiki.quota` configured by environment variables only: the queue file applied at start,
    Admit with a bearer token, the lifecycle of the admitted job metered and its quota released, and the
    queue's state on quota.state."""
    if broker_kind == "noida":
        pytest.skip("checked on Apache Kafka")
    process, grpc_port, _, log = start_quota_process(kafka_settings, database_settings, tmp_path)
    pool = await migrated_pool(database_settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            reply = await admit_when_up(quota_pb2_grpc.QuotaStub(channel), process, log, "job-1", "org/team-a", 4)
            assert reply.admitted
        async with EventProducer(kafka_settings, "//kumiki/test") as producer:
            for state, seconds in (
                (events_pb2.JOB_STATE_RUNNING, 1_800_000_000),
                (events_pb2.JOB_STATE_COMPLETED, 1_800_000_090),
            ):
                message = events_pb2.JobLifecycle(
                    job=common_pb2.JobRef(job_id="job-1", generation=1), state=state, queue="org/team-a", gpus=4,
                    gpu_model="A100",
                )  # fmt: skip
                message.at.seconds = seconds
                await producer.publish(JOB_LIFECYCLE, "job-1", message)

        async def metered() -> bool:
            return bool(await pool.fetchval("SELECT count(*) FROM quota.ledger"))

        await wait_until(metered, timeout_s=60, what=f"the ledger row (log: {log})")
        assert await pool.fetchval("SELECT gpu_seconds FROM quota.ledger WHERE job_id = 'job-1'") == 360
        assert await pool.fetchval("SELECT count(*) FROM quota.holdings") == 0  # quota released
        states = [
            events_pb2.QuotaState.FromString(value)
            for value in await read_topic(kafka_settings, QUOTA_STATE.full_name(kafka_settings.topic_prefix), 5)
        ]
        assert {state.queue for state in states} >= {"org", "org/team-a", "org/batch", "other", "other/batch2"}
    finally:
        process.terminate()
        process.wait(timeout=30)
        await pool.close()


def start_quota_process(
    kafka: KafkaSettings, database: DatabaseSettings, tmp_path: Path
) -> tuple[subprocess.Popen[bytes], int, int, Path]:
    """`python -m kumiki.quota` configured by environment variables only (tree(capacity=16), the test tokens)."""
    (tmp_path / "queues.yaml").write_text(yaml.safe_dump(tree(capacity=16)))
    (tmp_path / "tokens.yaml").write_text(yaml.safe_dump({token_digest(token): who for who, token in TOKENS.items()}))
    grpc_port, http_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")},
        "PYTHONPATH": f"{REPO_ROOT / 'services'}:{REPO_ROOT}",
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_DATABASE_URL": database.url,
        "KUMIKI_QUOTA_GRPC_PORT": str(grpc_port),
        "KUMIKI_QUOTA_HTTP_PORT": str(http_port),
        "KUMIKI_QUOTA_TOKENS_FILE": str(tmp_path / "tokens.yaml"),
        "KUMIKI_QUOTA_CONFIG_FILE": str(tmp_path / "queues.yaml"),
        "KUMIKI_QUOTA_STATE_INTERVAL_S": "0.2",
    }
    log = tmp_path / "quota.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "kumiki.quota"], env=env, stdout=out, stderr=out)
    return process, grpc_port, http_port, log


async def admit_when_up(
    stub: quota_pb2_grpc.QuotaStub,
    process: subprocess.Popen[bytes],
    log: Path,
    job: str,
    queue: str,
    gpus: float,
    *,
    identity: str = "alice",
    preemptible: bool = False,
) -> quota_pb2.AdmitResponse:
    """Admit, asked again while the service is still starting (UNAVAILABLE); any other error fails the test."""
    for _ in range(300):
        try:
            reply: quota_pb2.AdmitResponse = await stub.Admit(
                admit_request(job, queue, gpus, preemptible=preemptible), metadata=bearer(identity)
            )
            return reply
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or process.poll() is not None:
                raise AssertionError(f"{error.details()} (log: {log.read_text()[-2000:]})") from None
            await asyncio.sleep(0.1)
    raise AssertionError(f"quota never answered (log: {log.read_text()[-2000:]})")


def scraped(port: int, name: str, labels: dict[str, str]) -> float | None:
    return next((s.value for s in metric_samples(port) if s.name == name and labels.items() <= s.labels.items()), None)


def node_state(name: str, healthy: bool = True, gpus: int = 8) -> events_pb2.NodeState:
    return events_pb2.NodeState(
        node=name,
        healthy=healthy,
        gpus=[events_pb2.GpuState(index=index, model="A100", healthy=True) for index in range(gpus)],
    )


@pytest.mark.kafka
@pytest.mark.postgres
async def test_a_failed_node_is_not_lent_until_it_is_back(
    kafka_settings: KafkaSettings, database_settings: DatabaseSettings, tmp_path: Path, broker_kind: str
) -> None:
    """The quota process reads cluster.state: with one of its two 8-GPU nodes unhealthy, the 16 GPUs of the
    queue file lend only 8 to borrowers (a guarantee is still admitted), and all 16 again once it is back."""
    if broker_kind == "noida":
        pytest.skip("checked on Apache Kafka")
    await ensure_topics(kafka_settings, [CLUSTER_STATE])
    async with EventProducer(kafka_settings, "//kumiki/test") as producer:
        for name in ("n1", "n2"):  # before quota starts: read while it catches up
            await producer.publish(CLUSTER_STATE, name, node_state(name))
        process, grpc_port, http_port, log = start_quota_process(kafka_settings, database_settings, tmp_path)

        async def live_gpus(expected: float) -> bool:
            return scraped(http_port, "kumiki_quota_live_gpus", {"model": "A100"}) == expected

        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                stub = quota_pb2_grpc.QuotaStub(channel)

                async def borrow(job: str) -> quota_pb2.AdmitResponse:
                    return await admit_when_up(
                        stub, process, log, job, "org/batch", 1, identity="erin", preemptible=True
                    )

                for index in range(8):
                    assert (await borrow(f"b-{index}")).admitted
                await producer.publish(CLUSTER_STATE, "n2", node_state("n2", healthy=False))
                await wait_until(lambda: live_gpus(8.0), timeout_s=30, what=f"n2 no longer counted (log: {log})")
                denied = await borrow("b-8")  # 8 borrowed on the 8 GPUs left: nothing idle to lend
                assert not denied.admitted and denied.reason.code == "insufficient_gpus", denied
                assert (await admit_when_up(stub, process, log, "owned", "org/team-a", 4)).admitted  # guaranteed
                await producer.publish(CLUSTER_STATE, "n2", node_state("n2"))
                await wait_until(lambda: live_gpus(16.0), timeout_s=30, what=f"n2 counted again (log: {log})")
                assert (await borrow("b-9")).admitted  # 13 of 16 held
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_a_queue_gone_from_the_tree_loses_its_gauges() -> None:
    from kumiki.quota.adapters.publisher import export_statuses
    from kumiki.quota.core import QueueStatus

    labels = {"queue": "org/gone", "kind": "guaranteed"}
    exported = export_statuses([QueueStatus("org/gone", 4.0, 0.0, 1.0, 0.0, 0.0, 2.0)], set())
    assert REGISTRY.get_sample_value("kumiki_quota_queue_gpus", labels) == 4.0
    assert export_statuses([], exported) == set()
    assert REGISTRY.get_sample_value("kumiki_quota_queue_gpus", labels) is None
