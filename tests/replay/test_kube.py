"""The main job through Kubernetes: `kumiki up --kubernetes` (etcd, kube-apiserver, KWOK, the binder), then
`kumiki replay` submits PodGroups and pods. A borrower is evicted by quota reclaim through the Eviction API when
the owner's job arrives, the replay (as a job controller would) creates its pods again for the next generation,
and the binder binds and reports them: RUNNING and COMPLETED come from real pod phases."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import events_pb2
from kumiki.devstack.kube import KubeBinaries
from kumiki.devstack.processes import free_port
from tests.conftest import read_records
from tests.devstack.test_stack import kumiki, stack_home  # noqa: F401  (the fixture)
from tests.replay.support import replayed, write_trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


async def test_replay_through_the_binder_evicts_a_borrower_and_its_next_generation_runs(
    stack_home: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    missing = KubeBinaries.from_env().missing()
    if missing:
        pytest.skip(f"Kubernetes binaries not built ({', '.join(missing)}): run bash infra/kube/build.sh")
    ports = ["--kafka-port", str(free_port()), "--postgres-port", str(free_port())]
    up = kumiki(stack_home, "up", "--kubernetes", "--no-replay", *ports, timeout=600)
    # the fixture's `kumiki down` stops the stack, the API server included
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    # two queues of equal guarantee (Philly VCs of 64 nodes each): 8 GPUs each on 2 nodes
    trace = write_trace(
        tmp_path / "reclaim.csv", [("borrower", 0, 16, 3000, "6214e9"), ("owner", 300, 8, 600, "b436b2")]
    )
    out = tmp_path / "report"
    results = replayed(
        stack_home,
        out,
        *("--trace", str(trace), "--nodes", "2", "--speed", "100", "--phases", "kumiki", "--idle-fraction", "0"),
        timeout=400,
    )
    assert results["via"] == "pods"
    phase = results["phases"]["kumiki"]
    assert phase["problems"] == [] and phase["errors"] == [] and phase["summary"]["completed"] == 2
    with (out / "jobs.csv").open() as handle:
        rows = {row["job_id"].rsplit("/", 1)[1]: row for row in csv.DictReader(handle)}
    borrower, owner = rows["j00000"], rows["j00001"]
    assert int(borrower["runs"]) == 2  # evicted once, then its next generation ran to the end
    assert float(owner["bound_s"]) - float(owner["submitted_s"]) < 3000  # it did not wait for the borrower

    state = json.loads((stack_home / "stack.json").read_text())
    kafka = KafkaSettings(bootstrap=state["broker"]["bootstrap"])
    records = await read_records(kafka, JOB_LIFECYCLE.full_name(kafka.topic_prefix), 8, timeout_s=60)
    events = [events_pb2.JobLifecycle.FromString(record.value) for record in records]
    mine = [e for e in events if e.job.job_id == borrower["job_id"]]
    seen = {(e.job.generation, e.state) for e in mine}
    assert (1, events_pb2.JOB_STATE_PREEMPTED) in seen
    # the binder reports these from the pods' phases, so real pods of the second generation ran and ended
    assert {(2, events_pb2.JOB_STATE_RUNNING), (2, events_pb2.JOB_STATE_COMPLETED)} <= seen
