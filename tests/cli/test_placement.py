"""`kumiki placement bind|release|explain` against a real placement service (in-process, real gRPC and Kafka)."""

from __future__ import annotations

import asyncio
import json

import pytest

from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2
from tests.cli.test_quota import run
from tests.conftest import read_records, wait_until
from tests.placement.support import default_nodes, emulate, running_placement


async def test_release_outcome_reaches_the_event_log(kafka: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    await emulate(kafka, default_nodes(1))
    async with running_placement(kafka) as (host, _):
        assert host.runtime is not None
        await wait_until(lambda: len(host.runtime.components["book"].nodes) == 1, what="the nodes")  # type: ignore[union-attr]
        placement = ["placement", "--address", f"127.0.0.1:{host.grpc_port}"]
        code, out, _ = await asyncio.to_thread(
            run, [*placement, "bind", "cli-job", "--queue", "team-a", "--gpus", "2"], capsys
        )
        assert code == 0 and json.loads(out)["outcome"] == "OUTCOME_BOUND"
        code, out, _ = await asyncio.to_thread(
            run, [*placement, "release", "cli-job", "--outcome", "completed"], capsys
        )
        assert code == 0 and json.loads(out) == {"released": True, "gpus_freed": 2.0}
        code, out, _ = await asyncio.to_thread(run, [*placement, "explain", "cli-job"], capsys)
        assert code == 0 and json.loads(out)["status"] == "unknown"
    records = await read_records(kafka, JOB_LIFECYCLE.full_name(kafka.topic_prefix), 2)
    states = [events_pb2.JobLifecycle.FromString(record.value).state for record in records]
    assert states == [events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_COMPLETED]


def test_an_unknown_outcome_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["placement", "release", "j", "--outcome", "finished"], capsys)
    assert code == 2 and "--outcome" in err and "completed" in err


async def test_explain_says_since_when_a_requeued_job_waits_and_what_it_ran(
    kafka: KafkaSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    """What an operator reads of a job evicted by the coordinator and waiting again: since its eviction, one
    eviction, and the GPU-seconds it held (what the policy ranks it by)."""
    await emulate(kafka, default_nodes(1))
    async with running_placement(kafka) as (host, stub):
        assert host.runtime is not None
        book = host.runtime.components["book"]
        await wait_until(lambda: len(book.nodes) == 1, what="the nodes")  # type: ignore[attr-defined]
        placement = ["placement", "--address", f"127.0.0.1:{host.grpc_port}"]
        for job in ("evicted", "other"):
            code, _, _ = await asyncio.to_thread(
                run, [*placement, "bind", job, "--queue", "team-a", "--gpus", "8"], capsys
            )
            assert code == 0
        evicted = placement_pb2.ReleaseRequest(
            job=common_pb2.JobRef(job_id="evicted", generation=1), final_state=events_pb2.JOB_STATE_PREEMPTED
        )
        assert (await stub.Release(evicted)).released
        code, out, _ = await asyncio.to_thread(run, [*placement, "explain", "evicted"], capsys)
    explained = json.loads(out)
    assert code == 0 and explained["status"] == "pending" and explained["evictions"] == 1
    assert explained["attained_gpu_seconds"] > 0 and explained["waiting_since"].endswith("Z")
