"""The placement process is SIGKILLed in the middle of a stream of binds and restarted: every bind a client
saw acknowledged comes back identical, and no GPU is held twice."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import placement_pb2, placement_pb2_grpc
from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import readiness
from tests.conftest import wait_until
from tests.placement.support import bind_request, default_nodes, emulate, placement_process_env
from tests.placement.test_service import BOUND, assert_never_over_allocated, random_pods

pytestmark = pytest.mark.slow


def start(kafka: KafkaSettings, grpc_port: int, http_port: int, log: Path) -> subprocess.Popen[bytes]:
    env = placement_process_env(kafka, grpc_port, http_port)
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kumiki.placement"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


def ready(http_port: int) -> bool:
    return readiness(http_port)[0] == "ready"


async def test_sigkill_mid_stream_rebuilds_every_acknowledged_bind(kafka: KafkaSettings, tmp_path: Path) -> None:
    nodes = default_nodes(8)
    await emulate(kafka, nodes)
    grpc_port, http_port = free_port(), free_port()
    log = tmp_path / "placement.log"
    process = start(kafka, grpc_port, http_port, log)
    rng = random.Random(11)
    requests = [bind_request(f"job-{index}", random_pods(rng)) for index in range(400)]
    acknowledged: dict[str, placement_pb2.BindResponse] = {}
    try:
        await wait_until(lambda: ready(http_port), timeout_s=60, what="placement to be ready")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = placement_pb2_grpc.PlacementStub(channel)

            async def client(share: list[placement_pb2.BindRequest]) -> None:
                for request in share:
                    try:
                        acknowledged[request.job.job_id] = await stub.Bind(request, timeout=5)
                    except grpc.aio.AioRpcError:
                        return  # the server died under us: this bind was never acknowledged

            clients = [asyncio.create_task(client(requests[index::8])) for index in range(8)]
            await wait_until(lambda: len(acknowledged) >= 60, timeout_s=60, what="60 acknowledged binds")
            process.send_signal(signal.SIGKILL)
            process.wait()
            await asyncio.gather(*clients)
        assert 60 <= len(acknowledged) < len(requests), "the kill must land in the middle of the stream"

        process = start(kafka, grpc_port, http_port, log)
        await wait_until(lambda: ready(http_port), timeout_s=60, what="placement to be ready after the restart")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = placement_pb2_grpc.PlacementStub(channel)
            bound_before = {job: answer for job, answer in acknowledged.items() if answer.outcome == BOUND}
            for job, answer in bound_before.items():
                request = next(r for r in requests if r.job.job_id == job)
                replayed = await stub.Bind(request)
                assert replayed.outcome == BOUND and list(replayed.assignments) == list(answer.assignments), job
            table = {}
            for request in requests:  # acknowledged or not: whatever the rebuilt table holds
                explained = await stub.Explain(placement_pb2.ExplainRequest(job_id=request.job.job_id))
                if explained.status == "bound":
                    table[request.job.job_id] = placement_pb2.BindResponse(assignments=explained.assignments)
        assert set(bound_before) <= set(table)
        assert_never_over_allocated(table, nodes)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
