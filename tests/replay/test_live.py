"""The main job for real: `kumiki up` replays a small trace through every live service (development broker,
embedded Postgres, the five services as processes), baseline and Kumiki phases, and the run is checked from the
outside: every job completed once, no GPU held by two jobs at any event of the log, the quota ledger equal to
the GPU-seconds the jobs held (and not zero); then the README's next commands work without --address, a zombie
is reclaimed, and jobs that report their progress (`--progress-reports`) are forecast again from it."""

from __future__ import annotations

import csv
import json
from decimal import Decimal
from pathlib import Path

import asyncpg
import pytest

from kumiki.common.bus.topics import JOB_FORECAST, JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.devstack.processes import free_port
from kumiki.replay.core import double_holds, plan_jobs
from kumiki.sim.trace import load_jobs
from tests.conftest import read_records, wait_until
from tests.devstack.test_stack import kumiki, stack_home  # noqa: F401  (the fixture)
from tests.replay.support import replayed, write_trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def small_trace(path: Path) -> int:
    """60 short jobs of the bundled excerpt, arrivals ten times denser so that two 8-GPU nodes queue."""
    jobs = [job for job in load_jobs("philly-replay") if job.duration_s is not None and job.duration_s <= 3600][:60]
    rows = [(job.job_id, (job.submit_s or 0) / 10, int(job.gpus), job.duration_s or 0, job.queue) for job in jobs]
    write_trace(path, rows)
    return len(jobs)


async def test_up_replays_a_trace_and_every_gpu_second_is_billed_once(stack_home: Path, tmp_path: Path) -> None:  # noqa: F811
    trace = tmp_path / "small.csv"
    planned = small_trace(trace)
    out = tmp_path / "report"
    ports = ["--kafka-port", str(free_port()), "--postgres-port", str(free_port())]
    up = kumiki(
        stack_home,
        "up",
        *ports,
        "--replay-trace",
        str(trace),
        "--replay-nodes",
        "2",
        "--replay-speed",
        "500",
        "--replay-out",
        str(out),
        timeout=420,
    )
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results["phases"]) == {"baseline", "kumiki"}
    for phase in results["phases"].values():
        assert phase["problems"] == [] and phase["errors"] == []
        assert phase["summary"]["completed"] == planned
    # the nodes sampled their GPUs all along (the zombie case below checks what telemetry makes of them)
    assert results["samples_published"] > 0
    assert results["phases"]["baseline"]["summary"]["idle_reclaimed"] == 0  # today's cluster leaves them be
    assert (out / "report.png").stat().st_size > 10_000
    assert "| average JCT (s) |" in (out / "report.md").read_text()

    # The log, read independently: each (job, generation) bound once and ended once, no GPU held twice.
    state = json.loads((stack_home / "stack.json").read_text())
    kafka = KafkaSettings(bootstrap=state["broker"]["bootstrap"])
    prefixes = tuple(phase["prefix"] for phase in results["phases"].values())
    records = await read_records(kafka, JOB_LIFECYCLE.full_name(kafka.topic_prefix), 4 * planned, timeout_s=60)
    events = [events_pb2.JobLifecycle.FromString(record.value) for record in records]
    ours = [event for event in events if event.job.job_id.startswith(prefixes)]
    held: dict[tuple[str, int], tuple[int, Decimal]] = {}
    billed: dict[tuple[str, int], Decimal] = {}
    timeline = []
    for event in sorted(ours, key=lambda e: (e.at.seconds, e.at.nanos, e.state == events_pb2.JOB_STATE_BOUND)):
        key = (event.job.job_id, event.job.generation)
        at_us = event.at.seconds * 1_000_000 + event.at.nanos // 1000
        gpus = frozenset((a.node, int(i)) for a in event.assignments for i in a.gpu_indices)
        if event.state == events_pb2.JOB_STATE_BOUND:
            assert key not in held, f"{key} bound twice"
            held[key] = (at_us, Decimal(repr(event.gpus)))
            timeline.append(("bound", *key, gpus))
        elif event.state in (events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_PREEMPTED):
            assert key in held and key not in billed, f"{key} ended without a hold, or twice"
            start, demand = held[key]
            billed[key] = demand * Decimal(at_us - start) / 1_000_000
            timeline.append(("ended", *key, gpus))
    completed = {job for job, _ in billed}
    assert len(completed) == 2 * planned  # every job of both phases; more holds than jobs where idle reclaim acted
    assert double_holds(timeline) == []
    expected = sum(billed.values(), Decimal(0))
    assert expected > 0

    # The quota ledger meters the same intervals (BOUND to COMPLETED), exactly, each once.
    connection = await asyncpg.connect(state["database"]["url"])
    try:

        async def metered() -> bool:
            count = await connection.fetchval(
                "SELECT count(*) FROM quota.ledger WHERE job_id LIKE ANY($1::text[])", [p + "%" for p in prefixes]
            )
            return int(count) == len(billed)

        await wait_until(metered, timeout_s=60, what="every replayed job in the quota ledger")
        ledger = await connection.fetchval(
            "SELECT sum(gpu_seconds) FROM quota.ledger WHERE job_id LIKE ANY($1::text[])", [p + "%" for p in prefixes]
        )
    finally:
        await connection.close()
    assert ledger == expected

    # The README's next commands, with no --address and no --database-url.
    report = kumiki(stack_home, "quota", "report", "--by", "queue", "--csv", str(tmp_path / "usage.csv"))
    assert report.returncode == 0, report.stderr
    with (tmp_path / "usage.csv").open() as handle:
        total = sum(Decimal(row["gpu_seconds"]) for row in csv.DictReader(handle))
    assert total >= expected
    bind = kumiki(stack_home, "placement", "bind", "demo-1", "--queue", "research", "--gpus", "8")
    assert bind.returncode == 0 and '"OUTCOME_BOUND"' in bind.stdout, bind.stdout + bind.stderr
    explain = kumiki(stack_home, "placement", "explain", "demo-1")
    assert explain.returncode == 0 and '"node": "' in explain.stdout, explain.stdout + explain.stderr
    released = kumiki(stack_home, "placement", "release", "demo-1", "--outcome", "completed")
    assert released.returncode == 0 and '"released": true' in released.stdout, released.stdout + released.stderr

    # A zombie and a job behind it on one node: today's cluster makes the second job wait out the zombie; Kumiki's
    # telemetry finds the zombie idle from its GPU samples, placement reclaims it (checkpoint, evict, requeue) for
    # the job quota holds back in the same queue, and the zombie resumes afterwards.
    queue = load_jobs("philly-replay")[0].queue
    pair = write_trace(tmp_path / "zombie.csv", [("zombie", 0, 8, 6000, queue), ("worker", 300, 8, 600, queue)])
    seed = next(
        seed
        for seed in range(100)
        if [job.idle for job in plan_jobs(load_jobs(str(pair)), gpus_per_node=8, nodes=1, idle_fraction=0.5, seed=seed)]
        == [True, False]
    )
    reclaim_out = tmp_path / "reclaim"
    reclaim = replayed(
        stack_home,
        reclaim_out,
        *("--trace", str(pair), "--nodes", "1", "--speed", "500", "--idle-fraction", "0.5", "--seed", str(seed)),
    )
    with (reclaim_out / "jobs.csv").open() as handle:
        rows = {(row["phase"], row["job_id"].rsplit("-", 1)[-1]): row for row in csv.DictReader(handle)}

    def waited(phase: str) -> float:
        row = rows[(phase, "worker")]
        return float(row["bound_s"]) - float(row["submitted_s"])

    baseline, kumiki_phase = reclaim["phases"]["baseline"], reclaim["phases"]["kumiki"]
    assert baseline["problems"] == [] and kumiki_phase["problems"] == []
    assert baseline["summary"]["idle_found"] == 1 and baseline["summary"]["idle_reclaimed"] == 0
    # telemetry's delay in trace seconds (wall x 500): the rule's 600 s and the pipeline's part; the twin takes it
    found_after = baseline["summary"]["idle_found_after_s"]
    assert 300 <= found_after < 6000
    assert reclaim["simulated_phases"]["baseline"]["idle_found_after_s"] == max(600.0, found_after)
    assert waited("baseline") >= 5000  # it waited for the zombie to end
    assert kumiki_phase["summary"]["idle_found"] >= 1 and kumiki_phase["summary"]["idle_reclaimed"] >= 1
    assert int(rows[("kumiki", "zombie")]["runs"]) >= 2  # checkpointed, evicted, requeued, bound again
    assert waited("kumiki") < waited("baseline") / 2

    # Jobs that report their progress (a scenario the trace does not carry): at 1,800 and 3,600 s of their work
    # each sends step / total_steps through the Checkpoints service, and the forecast service forecasts it again.
    long_jobs = write_trace(tmp_path / "long.csv", [("long-a", 0, 8, 7200, queue), ("long-b", 60, 1, 4000, queue)])
    progress_out = tmp_path / "progress"
    reported = replayed(
        stack_home,
        progress_out,
        *("--trace", str(long_jobs), "--nodes", "1", "--speed", "500", "--idle-fraction", "0"),
        *("--phases", "kumiki", "--policy", "kumiki", "--progress-reports", "1"),
    )
    phase = reported["phases"]["kumiki"]
    assert phase["problems"] == [] and phase["errors"] == []
    assert reported["progress_reporters"] == 2 and phase["progress_reported"] >= 4  # 1,800 and 3,600 s each
    assert "Progress reports (a scenario, not in the trace)" in (progress_out / "report.md").read_text()
    ours = {phase["prefix"] + "long-a", phase["prefix"] + "long-b"}

    def progress_forecasts(records: list) -> set[str]:  # type: ignore[type-arg]
        forecasts = (events_pb2.RuntimeForecast.FromString(record.value) for record in records)
        return {forecast.job.job_id for forecast in forecasts if forecast.model == "progress"} & ours

    await read_records(
        kafka,
        JOB_FORECAST.full_name(kafka.topic_prefix),
        1,
        timeout_s=60,
        until=lambda r: progress_forecasts(r) == ours,
    )
