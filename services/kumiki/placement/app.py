"""Placement service wiring: rebuild the book from the event log, then serve Bind/Release/Explain,
follow cluster.state and run the scheduling cycle."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Mapping

import grpc

from kumiki.common.config import ConfigError, env_choice, env_float, env_optional, env_secret
from kumiki.common.contracts.v1 import placement_pb2_grpc
from kumiki.common.grpcutil import channel_credentials
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.placement.adapters.admission import Admission, AllowAllAdmission, QuotaServiceAdmission
from kumiki.placement.adapters.events import DecisionPublisher, NodeTable, follow_tables, rebuild
from kumiki.placement.adapters.grpc import PlacementServicer
from kumiki.placement.core import LIVE_POLICIES, PlacementBook, parse_idle_reclaim
from kumiki.quota.adapters.auth import QueueAuthorizer
from kumiki.sched.placement import STRATEGIES
from kumiki.sched.scheduler import MIN_RUN_BEFORE_PREEMPT_S

log = logging.getLogger(__name__)


def admission_from_env() -> Admission:
    address = env_optional(os.environ, "KUMIKI_QUOTA_ADDRESS")
    if address is None:
        return AllowAllAdmission()
    if ":" not in address:
        raise ConfigError(f"KUMIKI_QUOTA_ADDRESS: expected host:port, got {address!r}")
    return QuotaServiceAdmission(address, env_secret(os.environ, "KUMIKI_QUOTA_TOKEN"), quota_credentials(os.environ))


def quota_credentials(env: Mapping[str, str]) -> grpc.ChannelCredentials | None:
    """TLS to the quota service: its CA (KUMIKI_QUOTA_CAFILE) and, for mTLS, placement's own certificate
    (KUMIKI_QUOTA_CERTFILE and KUMIKI_QUOTA_KEYFILE; its CN is the identity quota checks). None: plaintext."""
    return channel_credentials(env, "KUMIKI_QUOTA")


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    strategy = env_choice(os.environ, "KUMIKI_PLACEMENT_STRATEGY", "kumiki", STRATEGIES)
    policy = env_choice(os.environ, "KUMIKI_PLACEMENT_POLICY", "fifo-backfill", LIVE_POLICIES)
    period_s = env_float(os.environ, "KUMIKI_PLACEMENT_CYCLE_S", 1.0, minimum=0.05, maximum=3600)
    min_run_s = env_float(
        os.environ, "KUMIKI_PLACEMENT_MIN_RUN_S", MIN_RUN_BEFORE_PREEMPT_S, minimum=0.0, maximum=7 * 86400.0
    )
    try:
        idle = parse_idle_reclaim(os.environ.get("KUMIKI_PLACEMENT_IDLE_RECLAIM", ""))
    except ValueError as error:
        raise ConfigError(f"KUMIKI_PLACEMENT_IDLE_RECLAIM: {error}") from None
    book = PlacementBook(strategy=strategy, policy=policy, min_run_s=min_run_s, idle_policies=idle)
    publisher = DecisionPublisher(runtime.producer, policy=f"{policy}/{strategy}")
    authorizer = QueueAuthorizer.from_env(os.environ, "KUMIKI_PLACEMENT")  # queue owners, as quota checks them
    if authorizer is None:
        log.warning("KUMIKI_PLACEMENT_QUEUES_FILE is not set: any caller may bind into any queue (development only)")
    servicer = PlacementServicer(book, publisher, admission_from_env(), authorizer)
    tables = await follow_tables(runtime.settings.kafka, book)  # checkpoints and forecasts, before the rebuild
    nodes, _ = await rebuild(runtime.settings.kafka, book, servicer.wake)
    # The rebuilt book is long-lived: moving it out of the collector's sight keeps full collections, and the
    # pauses they put into Bind's latency tail, short (a later rebuild's old table is then never freed: rare).
    gc.freeze()
    # A bind allocates a few hundred short-lived objects (requests, decisions, futures); at the default
    # threshold (700) the young generation is collected every few binds. 50,000 keeps the collections, and the
    # CPU they take from binds (about 7% of it in the benchmark), rare, at the cost of a few MB held longer.
    gc.set_threshold(50_000, 50, 100)
    nodes.handle = NodeTable(book, servicer.wake, publisher)  # live node changes may displace jobs: publish that
    runtime.background.append(asyncio.create_task(nodes.follow(runtime.stopping), name="follow-cluster-state"))
    cycles = servicer.run_cycles(runtime.stopping, period_s)
    runtime.background.append(asyncio.create_task(cycles, name="scheduling-cycle"))
    runtime.closers.append(nodes.stop)
    for table in tables:
        runtime.background.append(asyncio.create_task(table.follow(runtime.stopping), name=f"follow-{table.spec.name}"))
        runtime.closers.append(table.stop)
    runtime.components.update(book=book, servicer=servicer)
    placement_pb2_grpc.add_PlacementServicer_to_server(servicer, server)


SPEC = ServiceSpec(name="placement", grpc_port=50051, http_port=8081, wire=wire, grpc_services=("kumiki.v1.Placement",))
