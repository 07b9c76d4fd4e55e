"""The live preemption stack for tests: placement (in-process, `kumiki` policy) and the preemption service as a
process (so it can be SIGKILLed), over Apache Kafka and Postgres, with two emulated 8-GPU nodes, plus a runner
that plays the binder: it binds, starts the training process of each attempt, and kills it on EVICT."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import grpc
from aiokafka import AIOKafkaConsumer

from kumiki.common.bus import EventConsumer, EventProducer
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.db import apply_migrations, create_pool
from kumiki.common.service import ServiceHost
from kumiki.devstack.cluster import NodeShape, emulated_nodes
from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import readiness
from kumiki.placement.app import SPEC as PLACEMENT
from kumiki.quota.adapters.ledger import LedgerHandler
from tests.conftest import REPO_ROOT, wait_until
from tests.placement.support import bind_request, emulate, settings_for, whole

H100 = NodeShape("H100-80GB", 8, 81920, 8, 192_000, 2_097_152)
BOUND = placement_pb2.BindResponse.OUTCOME_BOUND


class Coordinator:
    """`python -m kumiki.preemption` on fixed ports (a restart keeps its address)."""

    def __init__(self, kafka: KafkaSettings, database: DatabaseSettings, placement: str, deadline_s: float, log: Path):
        self.grpc_port, self.http_port = free_port(), free_port()
        self.env = {
            **os.environ,
            "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
            "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
            "KUMIKI_DATABASE_URL": database.url,
            "KUMIKI_PREEMPTION_GRPC_PORT": str(self.grpc_port),
            "KUMIKI_PREEMPTION_HTTP_PORT": str(self.http_port),
            "KUMIKI_PLACEMENT_ADDRESS": placement,
            "KUMIKI_PREEMPTION_DEADLINE_S": str(deadline_s),
            "PYTHONPATH": str(REPO_ROOT / "services"),
        }
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "kumiki.preemption"], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        await wait_until(lambda: readiness(self.http_port)[0] == "ready", timeout_s=60, what="preemption ready")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Events:
    """Everything on kumiki.preemption.commands and kumiki.job.lifecycle, decoded, as it arrives."""

    commands: list[events_pb2.PreemptionCommand] = field(default_factory=list)
    lifecycle: list[events_pb2.JobLifecycle] = field(default_factory=list)
    decisions: list[events_pb2.SchedulingDecision] = field(default_factory=list)

    def preempt_decisions(self, job: str) -> list[events_pb2.SchedulingDecision]:
        return [d for d in self.decisions if d.job.job_id == job and d.kind == events_pb2.DECISION_KIND_PREEMPT]

    def command(self, job: str, generation: int, action: int) -> events_pb2.PreemptionCommand | None:
        for command in self.commands:
            if command.job.job_id == job and command.job.generation == generation and command.action == action:
                return command
        return None

    def states(self, job: str) -> list[tuple[int, int]]:
        return [(event.job.generation, event.state) for event in self.lifecycle if event.job.job_id == job]


async def follow(kafka: KafkaSettings, events: Events, stopping: asyncio.Event) -> None:
    topics = {
        f"{kafka.topic_prefix}preemption.commands": (events_pb2.PreemptionCommand, events.commands),
        f"{kafka.topic_prefix}job.lifecycle": (events_pb2.JobLifecycle, events.lifecycle),
        f"{kafka.topic_prefix}scheduling.decisions": (events_pb2.SchedulingDecision, events.decisions),
    }
    consumer = AIOKafkaConsumer(
        *topics, **kafka.client_options(), auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    try:
        while not stopping.is_set():
            for partition, records in (await consumer.getmany(timeout_ms=100)).items():
                kind, into = topics[partition.topic]
                into.extend(kind.FromString(record.value) for record in records)  # type: ignore[attr-defined]
    finally:
        await consumer.stop()


@dataclass
class Stack:
    placement: placement_pb2_grpc.PlacementStub
    coordinator: Coordinator
    events: Events
    kafka: KafkaSettings
    # stops placement and starts a fresh one on the same address, rebuilt from the topics as after a crash
    restart_placement: Callable[[], Awaitable[None]]


@asynccontextmanager
async def quota_ledger(kafka: KafkaSettings, database: DatabaseSettings) -> AsyncIterator[asyncpg.Pool]:
    """Quota's exactly-once ledger consumer of job.lifecycle (the service's own handler) on the test database."""
    pool = await create_pool(database)
    await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
    await apply_migrations(pool, "quota", "kumiki.quota.migrations")
    async with EventProducer(kafka, "//kumiki/quota/test") as producer:
        consumer = EventConsumer(kafka, [JOB_LIFECYCLE], "quota-ledger", LedgerHandler(), producer, pool=pool)
        await consumer.start()
        task = asyncio.create_task(consumer.run())
        try:
            yield pool
        finally:
            consumer.request_stop()
            await task
            await consumer.stop()
            await pool.close()


@asynccontextmanager
async def live_stack(
    kafka: KafkaSettings,
    database: DatabaseSettings,
    tmp: Path,
    *,
    deadline_s: float,
    idle_reclaim: str = "",
    policy: str = "kumiki",
) -> AsyncIterator[Stack]:
    await emulate(kafka, emulated_nodes(2, shapes=(H100,)))
    names = ("KUMIKI_PLACEMENT_POLICY", "KUMIKI_PLACEMENT_MIN_RUN_S", "KUMIKI_PLACEMENT_IDLE_RECLAIM")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(
        KUMIKI_PLACEMENT_POLICY=policy, KUMIKI_PLACEMENT_MIN_RUN_S="0", KUMIKI_PLACEMENT_IDLE_RECLAIM=idle_reclaim
    )
    port = free_port()  # fixed, so a restarted placement keeps the address the coordinator calls
    hosts = [ServiceHost(PLACEMENT, settings_for(kafka, grpc_port=port))]
    events = Events()
    stopping = asyncio.Event()
    follower: asyncio.Task[None] | None = None
    coordinator: Coordinator | None = None

    async def restart_placement() -> None:
        await hosts[-1].stop()
        hosts.append(ServiceHost(PLACEMENT, settings_for(kafka, grpc_port=port)))
        await hosts[-1].start()

    try:
        await hosts[0].start()
        coordinator = Coordinator(kafka, database, f"127.0.0.1:{port}", deadline_s, tmp / "preemption.log")
        await coordinator.start()
        follower = asyncio.create_task(follow(kafka, events, stopping))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Stack(placement_pb2_grpc.PlacementStub(channel), coordinator, events, kafka, restart_placement)
    finally:
        stopping.set()
        if follower is not None:
            await follower
        if coordinator is not None:
            coordinator.stop()
        await hosts[-1].stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def train_request(job: str, generation: int, gpus: int = 4, **fields: object) -> placement_pb2.BindRequest:
    return bind_request(job, [whole(gpus)], generation=generation, queue="team", **fields)


async def bind_until_bound(stack: Stack, request: placement_pb2.BindRequest, timeout_s: float = 60.0) -> str:
    """Bind (a caller's retries) until BOUND; returns the node. A newer generation is refused while the old one
    still holds GPUs (FAILED_PRECONDITION): that is "not yet" here."""

    async def bound() -> str | None:
        try:
            answer = await stack.placement.Bind(request)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None
            raise
        return answer.assignments[0].node if answer.outcome == BOUND else None

    node: str = await wait_until(bound, timeout_s=timeout_s, interval_s=0.2, what=f"{request.job.job_id} bound")
    return node


@dataclass
class Attempt:
    """One training process of one attempt."""

    process: asyncio.subprocess.Process
    progress: Path

    def answering(self) -> bool:
        """The job has begun writing the checkpoint that answers a CHECKPOINT command."""
        return self.progress.exists() and "# answering" in self.progress.read_text()

    def steps(self) -> list[tuple[int, float]]:
        if not self.progress.exists():
            return []
        rows = []
        for line in self.progress.read_text().splitlines():
            if line.startswith("#"):
                continue
            step, at = line.split()
            rows.append((int(step), float(at)))
        return rows


async def start_attempt(
    stack: Stack,
    job: str,
    generation: int,
    tmp: Path,
    *,
    steps: int,
    step_s: float,
    interval_s: float = 1000.0,
    ignore: bool = False,
    max_checkpoints: int = 0,
    save_s: float = 0.0,
) -> Attempt:
    progress = tmp / f"progress-{generation}.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "services"),
        "KUMIKI_JOB_ID": job,
        "KUMIKI_JOB_GENERATION": str(generation),
        "KUMIKI_CHECKPOINTS_ADDRESS": stack.coordinator.address,
        "KUMIKI_CHECKPOINT_INTERVAL_S": str(interval_s),
    }
    arguments = ["--steps", str(steps), "--step-s", str(step_s), "--out", str(tmp / "weights.npy")]
    arguments += ["--checkpoints", str(tmp / "checkpoints"), "--progress", str(progress)]
    if ignore:
        arguments.append("--ignore-commands")
    if save_s:
        arguments += ["--save-s", str(save_s)]
    if max_checkpoints:
        arguments += ["--max-checkpoints", str(max_checkpoints)]
    with (tmp / f"train-{generation}.log").open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kumiki.sdk.example", *arguments, env=env, stdout=log, stderr=log
        )
    return Attempt(process, progress)


def reference_weights(tmp: Path, steps: int) -> bytes:
    """The same training, never interrupted, without any coordinator."""
    out = tmp / "reference.npy"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kumiki.sdk.example",
            "--no-sdk",
            "--steps",
            str(steps),
            "--step-s",
            "0",
            "--out",
            str(out),
            "--checkpoints",
            str(tmp / "reference-checkpoints"),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "services")},
    )
    return out.read_bytes()


def job_ref(job: str, generation: int) -> common_pb2.JobRef:
    return common_pb2.JobRef(job_id=job, generation=generation)
