"""Placement test helpers: an in-process placement service (real gRPC, Apache Kafka) over an emulated cluster."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import grpc

from kumiki.common.config import DatabaseSettings, KafkaSettings, ServerSettings, Settings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.service import ServiceHost
from kumiki.devstack.cluster import emulated_nodes, publish_nodes
from kumiki.placement.app import SPEC
from tests.conftest import REPO_ROOT


def placement_process_env(kafka: KafkaSettings, grpc_port: int, http_port: int) -> dict[str, str]:
    """The environment of a `python -m kumiki.placement` child process on these ports and topics."""
    return {
        **os.environ,
        "KUMIKI_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "KUMIKI_TOPIC_PREFIX": kafka.topic_prefix,
        "KUMIKI_PLACEMENT_GRPC_PORT": str(grpc_port),
        "KUMIKI_PLACEMENT_HTTP_PORT": str(http_port),
        "PYTHONPATH": str(REPO_ROOT / "services"),
    }


def settings_for(kafka: KafkaSettings, grpc_port: int = 0, http_port: int = 0) -> Settings:
    return Settings(
        service="placement",
        kafka=kafka,
        database=DatabaseSettings(),
        server=ServerSettings(host="127.0.0.1", grpc_port=grpc_port, http_port=http_port),
        instance=f"placement-test-{uuid.uuid4().hex[:6]}",
    )


@asynccontextmanager
async def running_placement(
    kafka: KafkaSettings,
) -> AsyncIterator[tuple[ServiceHost, placement_pb2_grpc.PlacementStub]]:
    host = ServiceHost(SPEC, settings_for(kafka))
    try:
        await host.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{host.grpc_port}") as channel:
            yield host, placement_pb2_grpc.PlacementStub(channel)
    finally:
        await host.stop()


async def emulate(kafka: KafkaSettings, nodes: Sequence[events_pb2.NodeState]) -> None:
    await publish_nodes(kafka, nodes)


def default_nodes(count: int = 6) -> list[events_pb2.NodeState]:
    return emulated_nodes(count)


def bind_request(
    job: str, pods: Sequence[common_pb2.PodResources], generation: int = 1, queue: str = "team-a", **fields: object
) -> placement_pb2.BindRequest:
    return placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id=job, generation=generation),
        queue=queue,
        pods=list(pods),
        **fields,  # type: ignore[arg-type]
    )


def whole(gpus: int, model: str = "") -> common_pb2.PodResources:
    return common_pb2.PodResources(gpus=gpus, gpu_model=model)
