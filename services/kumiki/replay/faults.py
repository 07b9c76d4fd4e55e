"""The fault-injection run: a trace replayed through every live service while, in turn, each service is
SIGKILLed and restarted, Apache Kafka and Postgres are killed and restarted, and one service is paused
(SIGSTOP) past its Kafka session timeout; bad records are injected on the bus. At the end the checks are exact,
on what the broker and the database hold, not on what the services say: no GPU held by two jobs at any event,
no job lost or run twice, every job completed, the quota ledger equal to the GPU-seconds held (to the
microsecond), every consumer group's committed offset at the end of its topics, and nothing in the dead-letter
topic but the injected records.

The stack is private (its own KUMIKI_HOME, Apache Kafka and Postgres on free ports), because the run kills
them. A supervisor restarts any service process that exits, as Kubernetes would (a service exits on purpose
when its broker or database goes away: `ServiceHost.wait`); those restarts are counted and reported.

The stack and its supervisor are `replay.private_stack`; the end checks' reads of the broker and the database
are `replay.readback`.

    python benchmarks/fault_injection.py --jobs 10000 --nodes 96 --speed 1000   # the long run
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from aiokafka.structs import ConsumerRecord

from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import CLUSTER_STATE, DEAD_LETTER, GPU_SAMPLES, JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.data import resolve_trace
from kumiki.devstack.stack import SERVICES
from kumiki.quota.adapters.store import replace_tree
from kumiki.replay.checks import check_lifecycle, expected_ledger
from kumiki.replay.core import ReplayError, plan_jobs, queue_tree
from kumiki.replay.driver import Replay, publish_cluster
from kumiki.replay.private_stack import PrivateStack
from kumiki.replay.readback import group_lag, quota_ledger, read_topic
from kumiki.replay.runner import GPUS_PER_NODE, vc_weights
from kumiki.sim.trace import load_jobs

# aiokafka's default consumer session timeout (EventConsumer sets none): a pause longer than this makes the
# group rebalance the paused member's partitions away, and the member must notice it was fenced when it resumes
SESSION_TIMEOUT_S = 10.0
DEFAULT_FAULTS = (
    "kill:placement",
    "kill:quota",
    "kill:forecast",
    "kill:preemption",
    "kill:telemetry-ingest",
    "kafka",
    "postgres",
    "pause:quota",
)
BAD_TOPICS = (JOB_LIFECYCLE, CLUSTER_STATE, GPU_SAMPLES)
# cluster.state is read only by group-less readers (placement's view, the replay), which skip a record they cannot
# decode; the other two have consumer groups, and each group dead-letters each bad record once
DEAD_LETTERED = frozenset({JOB_LIFECYCLE.name, GPU_SAMPLES.name})
BAD_KEY = "fault-bad-"


@dataclass
class FaultSettings:
    trace: str = "philly-slice"
    jobs: int = 10_000
    nodes: int = 96
    speed: float = 1000.0
    max_duration_s: float | None = None  # cap each job's trace duration (Philly's run for up to a month)
    faults: tuple[str, ...] = DEFAULT_FAULTS
    pause_s: float = SESSION_TIMEOUT_S + 5.0
    bad_records: int = 30
    seed: int = 0
    timeout_s: float = 3600.0
    out: Path = Path("out/faults")
    home: Path | None = None  # the private stack's KUMIKI_HOME (None: a temporary folder, removed after)
    database: str = "embedded"

    def validate(self) -> None:
        if not 1 <= self.jobs <= 1_000_000:
            raise ReplayError(f"--jobs: expected 1..1000000, got {self.jobs}")
        if not 2 <= self.nodes <= 10_000:
            raise ReplayError(f"--nodes: expected 2..10000 (a 16-GPU gang needs two), got {self.nodes}")
        if not 1.0 <= self.speed <= 100_000.0:
            raise ReplayError(f"--speed: expected 1..100000, got {self.speed:g}")
        for fault in self.faults:
            kind, _, target = fault.partition(":")
            if not (fault in ("kafka", "postgres") or (kind in ("kill", "pause") and target in SERVICES)):
                raise ReplayError(
                    f"--faults: {fault!r} is not kafka, postgres, kill:SERVICE or pause:SERVICE"
                    f" (services: {', '.join(SERVICES)})"
                )
        if not SESSION_TIMEOUT_S < self.pause_s <= 600:
            raise ReplayError(f"--pause-s: expected more than the session timeout ({SESSION_TIMEOUT_S:g}) up to 600")
        if self.max_duration_s is not None and self.max_duration_s <= 0:
            raise ReplayError(f"--max-duration-s: must be > 0, got {self.max_duration_s:g}")
        if not 0 <= self.bad_records <= 100_000:
            raise ReplayError(f"--bad-records: expected 0..100000, got {self.bad_records}")
        if self.timeout_s <= 0:
            raise ReplayError(f"--timeout-s: must be > 0, got {self.timeout_s:g}")
        try:
            resolve_trace(self.trace)
        except FileNotFoundError as error:
            raise ReplayError(f"--trace: {error}") from None


@dataclass
class FaultRecord:
    """One injected fault: when (seconds since the replay started), and how long until every service answered
    its readiness check again and until the next bind after that."""

    fault: str
    at_s: float
    restart_s: float = 0.0  # the fault itself: kill and respawn, the broker's or database's restart, the pause
    ready_s: float | None = None  # fault (or, for a pause, SIGCONT) to every service ready
    next_bind_s: float | None = None  # fault (or SIGCONT) to the first BOUND seen after everything was ready
    service_restarts: list[str] = field(default_factory=list)  # exits the supervisor restarted meanwhile
    note: str = ""


# ---- bad records ------------------------------------------------------------------------------------------------


def bad_records(count: int, seed: int) -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]:
    """(topic, key, value, headers) records no consumer can apply: random bytes without CloudEvents headers,
    a valid event truncated, a payload of another type, one with the wrong schema version."""
    rng = random.Random(seed)
    valid = events_pb2.JobLifecycle(state=events_pb2.JOB_STATE_BOUND, queue="research", gpus=8).SerializeToString()
    made = []
    for index in range(count):
        spec = BAD_TOPICS[index % len(BAD_TOPICS)]
        key = f"{BAD_KEY}{spec.name}-{index}".encode()
        kind = index % 4
        headers: list[tuple[str, bytes]] = [
            ("ce_specversion", b"1.0"),
            ("ce_id", uuid.uuid4().hex.encode()),
            ("ce_source", b"//fault-injection"),
            ("ce_type", f"dev.kumiki.{spec.name}.v1".encode()),
            ("content-type", b"application/protobuf"),
        ]
        if kind == 0:
            value, headers = rng.randbytes(rng.randint(1, 200)), []
        elif kind == 1:
            value = valid[: max(1, len(valid) // 2)] + b"\xff\xff"
        elif kind == 2:
            value = rng.randbytes(64)
        else:
            value = valid
            headers = [(name, b"dev.kumiki.unknown.v9" if name == "ce_type" else v) for name, v in headers]
        made.append((spec.full_name(""), key, value, headers))
    return made


# ---- the run ------------------------------------------------------------------------------------------------


class FaultRun:
    def __init__(self, settings: FaultSettings, stack: PrivateStack) -> None:
        self.settings = settings
        self.stack = stack
        self.records: list[FaultRecord] = []
        self.replay: Replay | None = None
        self.t0 = 0.0
        self.t0_unix = 0.0  # the same instant on the wall clock, which the events' `at` use
        self._lock = asyncio.Lock()

    async def supervise(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            async with self._lock:
                await asyncio.to_thread(self.stack.supervise_once)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=0.5)

    async def _until(self, condition: Any, timeout_s: float) -> float | None:
        """Monotonic time `condition()` first held (polled), None when it did not within the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await condition():
                return time.monotonic()
            await asyncio.sleep(0.2)
        return None

    async def _recovered(self, record: FaultRecord, since: float) -> None:
        async def ready() -> bool:
            return await asyncio.to_thread(self.stack.all_ready)

        at_ready = await self._until(ready, 300.0)
        if at_ready is None:
            record.note = "not every service ready within 300 s"
            return
        record.ready_s = round(at_ready - since, 2)
        assert self.replay is not None
        binds = self.replay.counts.binds

        async def bound() -> bool:
            assert self.replay is not None
            return self.replay.counts.binds > binds or self.replay.counts.done >= len(self.replay.tracks)

        at_bind = await self._until(bound, 120.0)
        if at_bind is not None and self.replay.counts.binds > binds:
            record.next_bind_s = round(at_bind - since, 2)
        else:
            record.note = "no bind after recovery (nothing left waiting)"

    async def inject(self, fault: str, progress: Any = None) -> FaultRecord:
        record = FaultRecord(fault, round(time.monotonic() - self.t0, 2))
        crashes_before = len(self.stack.crashes)
        kind, _, service = fault.partition(":")
        started = time.monotonic()
        if kind == "pause":
            self.stack.paused.add(service)
            self.stack.signal(service, signal.SIGSTOP)
            await asyncio.sleep(self.settings.pause_s)
            self.stack.signal(service, signal.SIGCONT)
            self.stack.paused.discard(service)
            record.note = f"stopped {self.settings.pause_s:g} s (session timeout {SESSION_TIMEOUT_S:g} s)"
        else:
            async with self._lock:
                if kind == "kill":
                    self.stack.busy.add(service)
                    try:
                        await asyncio.to_thread(self.stack.kill, service)
                    finally:
                        self.stack.busy.discard(service)
                elif kind == "kafka":
                    await asyncio.to_thread(self.stack.restart_kafka)
                elif kind == "postgres":
                    await asyncio.to_thread(self.stack.restart_postgres)
        record.restart_s = round(time.monotonic() - started, 2)
        if kind == "pause":
            started = time.monotonic()  # recovery counts from SIGCONT
        await self._recovered(record, started)
        record.service_restarts = [name for _, name in self.stack.crashes[crashes_before:]]
        if progress is not None:
            progress(
                f"  {record.fault} at {record.at_s:.0f} s: down {record.restart_s} s, every service ready"
                f" {record.ready_s} s, next bind {record.next_bind_s} s;"
                f" restarts {record.service_restarts} {record.note}"
            )
        return record

    async def schedule(self, window_s: float, progress: Any = None) -> None:
        """The faults in turn, spread over the replay's submission window, each after the last recovered."""
        gap = window_s / (len(self.settings.faults) + 1)
        for index, fault in enumerate(self.settings.faults):
            due = self.t0 + gap * (index + 1)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            self.records.append(await self.inject(fault, progress))


async def _inject_bad(kafka: KafkaSettings, count: int, seed: int) -> set[bytes]:
    made = bad_records(count, seed)
    async with EventProducer(kafka, "//kumiki/fault-injection") as producer:
        for topic, key, value, headers in made:
            await producer.send_raw(kafka.topic_prefix + topic, key, value, headers)
    return {key for topic, key, _, _ in made if topic in DEAD_LETTERED}


async def run_faults(settings: FaultSettings, progress: Any = print) -> dict[str, Any]:
    """The whole run on a private stack; returns the results (also written to settings.out/results.json)."""
    settings.validate()
    trace = sorted(
        (job for job in load_jobs(settings.trace) if job.submit_s is not None and job.duration_s is not None),
        key=lambda job: (job.submit_s, job.job_id),
    )[: settings.jobs]
    jobs = plan_jobs(trace, gpus_per_node=GPUS_PER_NODE, nodes=settings.nodes, seed=settings.seed)
    if settings.max_duration_s is not None:
        jobs = [replace(job, duration_s=min(job.duration_s, settings.max_duration_s)) for job in jobs]
    capacity = settings.nodes * GPUS_PER_NODE
    temporary = settings.home is None
    home = settings.home or Path(tempfile.mkdtemp(prefix="kumiki-faults-"))
    stack = PrivateStack(home, settings.database)
    progress(f"starting a private stack in {home} (Apache Kafka, Postgres, {len(SERVICES)} services)")
    started = time.monotonic()
    results: dict[str, Any] = {}
    try:
        await asyncio.to_thread(stack.up)
        progress(f"stack ready in {time.monotonic() - started:.0f} s")
        await publish_cluster(stack.kafka, settings.nodes)
        await replace_tree(stack.db, queue_tree(jobs, capacity, vc_weights(), static=False), "fault injection")
        injected = await _inject_bad(stack.kafka, settings.bad_records, settings.seed)
        run = FaultRun(settings, stack)
        replay = Replay(
            jobs,
            placement_address=stack.address("placement"),
            kafka=stack.kafka,
            speed=settings.speed,
            phase="faults",
            preemptible=True,
            checkpoints_address=stack.address("preemption"),
        )
        run.replay = replay
        window_s = jobs[-1].submit_s / settings.speed
        progress(f"replaying {len(jobs)} jobs on {settings.nodes} nodes at {settings.speed:g}x ({window_s:.0f} s of"
                 f" arrivals); faults: {', '.join(settings.faults)}")  # fmt: skip
        fault_error = driver_failure = ""
        stopping = asyncio.Event()
        supervisor = asyncio.create_task(run.supervise(stopping), name="supervisor")
        run.t0, run.t0_unix = time.monotonic(), time.time()
        faults = asyncio.create_task(run.schedule(window_s, progress), name="faults")
        wall = time.monotonic()
        try:
            try:  # the checks below read the broker and the database, not the driver: a driver error is reported
                await replay.run(timeout_s=settings.timeout_s)
            except Exception as error:
                driver_failure = f"{type(error).__name__}: {error}"
                progress(f"the replay driver stopped: {driver_failure}")
            try:
                await faults
            except Exception as error:  # a fault that could not be injected or recovered from: reported, checked
                fault_error = f"{type(error).__name__}: {error}"
                progress(f"fault injection failed: {fault_error}")
        finally:
            faults.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await faults
        replay_wall = time.monotonic() - wall
        progress("replay done; waiting for every consumer to catch up")

        async def caught_up() -> bool:
            lag = await group_lag(stack.kafka, stack.db)
            return not any(lag.values())

        settled = await run._until(caught_up, 180.0)
        stopping.set()
        await supervisor
        lag = await group_lag(stack.kafka, stack.db)
        lifecycle_records = [
            record
            for record in await read_topic(stack.kafka, JOB_LIFECYCLE.full_name(stack.kafka.topic_prefix))
            if record.key is not None and record.key.decode(errors="replace").startswith(replay.prefix)
        ]
        lifecycle = [events_pb2.JobLifecycle.FromString(record.value) for record in lifecycle_records]
        verdict = check_lifecycle(list(replay.tracks), lifecycle)
        expected = expected_ledger(lifecycle)

        async def metered() -> bool:
            rows, _ = await quota_ledger(stack.db, replay.prefix)
            return len(rows) >= len(expected)

        await run._until(metered, 120.0)
        ledger, still_open = await quota_ledger(stack.db, replay.prefix)
        wrong = {key for key in set(ledger) | set(expected) if ledger.get(key) != expected.get(key)}
        mismatched = sorted(f"{job}/{gen}: ledger {ledger.get((job, gen))} held {expected.get((job, gen))}"
                            for job, gen in wrong)  # fmt: skip
        dead = await read_topic(stack.kafka, DEAD_LETTER.full_name(stack.kafka.topic_prefix))
        dead_keys = [record.key or b"" for record in dead]
        unexpected = sorted({key.decode(errors="replace") for key in dead_keys if key not in injected})
        missing = sorted(key.decode() for key in injected - set(dead_keys))
        invariants = {
            "every job completed, once": not any("completed" in p for p in verdict.problems),
            "no GPU held by two jobs": not any(" GPU " in p for p in verdict.problems),
            "no job ran two generations at once": not any("still held" in p for p in verdict.problems),
            "ledger == GPU-seconds held": not mismatched and still_open == 0 and bool(expected),
            "consumer groups at the end of their topics": not any(lag.values()),
            "dead-letter topic holds only the injected records": not unexpected and not missing,
        }
        results = {
            "trace": settings.trace,
            "jobs": len(jobs),
            "nodes": settings.nodes,
            "speed": settings.speed,
            "max_duration_s": settings.max_duration_s,
            "replay_wall_s": round(replay_wall, 1),
            "faults": [asdict(record) for record in run.records],
            "unplanned_restarts": [name for _, name in stack.crashes],
            "completed": verdict.completed,
            "generations": verdict.generations,
            "preempted": verdict.preempted,
            "lifecycle_events": len(lifecycle),
            "ledger_rows": len(ledger),
            "ledger_gpu_s": str(sum(ledger.values(), Decimal(0))),
            "held_gpu_s": str(sum(expected.values(), Decimal(0))),
            "ledger_mismatches": mismatched[:20],
            "mismatch_timelines": _timelines(wrong, lifecycle_records, lifecycle, run.t0_unix),
            "open_intervals_left": still_open,
            "consumer_lag": {group: behind for group, behind in lag.items() if behind},
            "groups_checked": sorted(lag),
            "settled_s": None if settled is None else round(settled - run.t0 - replay_wall, 1),
            "bad_records_injected": settings.bad_records,
            "bad_records_on_group_topics": len(injected),
            "dead_lettered": len(dead),
            "dead_letter_unexpected": unexpected[:20],
            "bad_records_not_dead_lettered": missing[:20],
            "problems": verdict.problems[:20],
            "fault_error": fault_error,
            "driver_failure": driver_failure,
            "driver_errors": replay.errors[:20],
            "invariants": invariants,
            "ok": all(invariants.values()) and not verdict.problems and not fault_error and not driver_failure,
        }
    finally:  # shielded from a ^C: the stack's processes must not outlive the run
        await asyncio.shield(asyncio.to_thread(stack.down))
        settings.out.mkdir(parents=True, exist_ok=True)
        if (home / "logs").exists():  # the services' own account of the run
            shutil.copytree(home / "logs", settings.out / "logs", dirs_exist_ok=True)
        if temporary:
            shutil.rmtree(home, ignore_errors=True)
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "results.json").write_text(json.dumps(results, indent=2))
    return results


def _timelines(
    keys: set[tuple[str, int]],
    records: Sequence[ConsumerRecord],
    events: Sequence[events_pb2.JobLifecycle],
    t0_unix: float,
) -> dict[str, list[str]]:
    """Each listed generation's job.lifecycle records as `state at S s (partition P, offset O)`, S from the start
    of the faults' clock: what a failed ledger check is read against, beside the fault table."""
    timelines: dict[str, list[str]] = {}
    for record, event in zip(records, events, strict=True):
        if (event.job.job_id, event.job.generation) in keys:
            at_s = event.at.seconds + event.at.nanos / 1e9 - t0_unix
            timelines.setdefault(f"{event.job.job_id}/{event.job.generation}", []).append(
                f"{events_pb2.JobState.Name(event.state)} at {at_s:.2f} s"
                f" (partition {record.partition}, offset {record.offset})"
            )
    return dict(sorted(timelines.items())[:20])


def markdown(results: dict[str, Any]) -> str:
    """The run's table for docs/benchmarks.md and docs/security.md."""
    lines = [
        f"{results['jobs']} jobs of {results['trace']} (durations capped at {results['max_duration_s']} s)"
        f" on {results['nodes']} nodes at {results['speed']:g}x,"
        f" {results['replay_wall_s']} s of replay; {results['generations']} bound generations,"
        f" {results['preempted']} preemptions",
        "",
        "| fault | at (s) | fault lasted (s) | every service ready (s) | next bind (s) | restarts it caused | note |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for fault in results["faults"]:
        lines.append(
            f"| {fault['fault']} | {fault['at_s']:.0f} | {fault['restart_s']} | {fault['ready_s']} |"
            f" {fault['next_bind_s']} |"
            f" {', '.join(fault['service_restarts']) or '-'} | {fault['note']} |"
        )
    lines += ["", "| invariant | held |", "|---|---|"]
    lines += [f"| {name} | {'yes' if held else '**NO**'} |" for name, held in results["invariants"].items()]
    lines += [
        "",
        f"ledger {results['ledger_gpu_s']} GPU-s in {results['ledger_rows']} rows, held {results['held_gpu_s']} GPU-s;"
        f" {results['bad_records_injected']} bad records injected, {results['dead_lettered']} dead-letter records"
        f" (one per consuming group), {len(results['groups_checked'])} consumer groups checked",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    defaults = FaultSettings()
    parser.add_argument("--trace", default=defaults.trace, help="a CSV path or a bundled trace name")
    parser.add_argument("--jobs", type=int, default=defaults.jobs, help="the trace's first N jobs")
    parser.add_argument("--nodes", type=int, default=defaults.nodes, help="emulated nodes of 8 GPUs")
    parser.add_argument("--speed", type=float, default=defaults.speed, help="trace seconds per wall second")
    parser.add_argument("--max-duration-s", type=float, default=None, help="cap each job's trace duration")
    parser.add_argument("--faults", default=",".join(defaults.faults), help="in order: kill:SERVICE, kafka, "
                        "postgres, pause:SERVICE")  # fmt: skip
    parser.add_argument("--pause-s", type=float, default=defaults.pause_s, help="how long the paused service stops")
    parser.add_argument("--bad-records", type=int, default=defaults.bad_records, help="undecodable records injected")
    parser.add_argument("--timeout-s", type=float, default=defaults.timeout_s, help="the replay's deadline")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="jobs' queues and the bad records")
    parser.add_argument("--database", choices=("embedded", "system"), default=defaults.database)
    parser.add_argument("--out", type=Path, default=defaults.out, help="where results.json goes")
    args = parser.parse_args(argv)
    settings = FaultSettings(
        trace=args.trace,
        jobs=args.jobs,
        nodes=args.nodes,
        speed=args.speed,
        max_duration_s=args.max_duration_s,
        faults=tuple(fault.strip() for fault in args.faults.split(",") if fault.strip()),
        pause_s=args.pause_s,
        bad_records=args.bad_records,
        timeout_s=args.timeout_s,
        out=args.out,
        database=args.database,
        seed=args.seed,
    )
    try:
        settings.validate()
    except ReplayError as error:
        parser.error(str(error))
    results = asyncio.run(run_faults(settings, progress=lambda line: print(line, flush=True)))
    print(markdown(results))
    for name in ("problems", "ledger_mismatches", "mismatch_timelines", "open_intervals_left", "consumer_lag",
                 "dead_letter_unexpected",
                 "bad_records_not_dead_lettered", "driver_errors"):  # fmt: skip
        if results.get(name):
            print(f"{name}: {json.dumps(results[name])[:2000]}")
    return 0 if results.get("ok") else 1
