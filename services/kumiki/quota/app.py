"""Quota service wiring: queue tree in Postgres, gRPC Quota, the exactly-once ledger consumer, publishers.

Configuration beyond the shared variables (README, "Configuration"):
- KUMIKI_QUOTA_TOKENS_FILE: YAML of bearer-token SHA-256 -> identity; with mTLS (KUMIKI_TLS_CLIENT_CAFILE)
  the certificate's common name is the identity. Without either the service refuses to start unless
  KUMIKI_QUOTA_ALLOW_ANONYMOUS=true (development: owner checks are skipped, and the log says so).
- KUMIKI_QUOTA_CONFIG_FILE: a queues.yaml applied at start (otherwise `kumiki quota load`).
- KUMIKI_QUOTA_STATE_INTERVAL_S (10), KUMIKI_QUOTA_HALF_LIFE_S (7 days): quota.state cadence, usage decay.
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc
import yaml

from kumiki.common.bus.replay import TopicReader
from kumiki.common.bus.topics import CLUSTER_STATE, JOB_LIFECYCLE
from kumiki.common.config import ConfigError, one_line
from kumiki.common.contracts.v1 import quota_pb2_grpc
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.quota.adapters.auth import ALLOW_ANONYMOUS, Authenticator, QuotaSettings
from kumiki.quota.adapters.grpc import QuotaServicer
from kumiki.quota.adapters.ledger import LedgerHandler
from kumiki.quota.adapters.nodes import LiveNodes
from kumiki.quota.adapters.publisher import Publisher
from kumiki.quota.adapters.store import QuotaStore, write_config
from kumiki.quota.core import parse_config

log = logging.getLogger(__name__)

CONSUMER_GROUP = "kumiki-quota"


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    assert runtime.pool is not None
    settings = QuotaSettings.from_env(os.environ)
    if settings.allow_anonymous and not settings.tokens and not settings.mtls:
        log.warning(
            f"{ALLOW_ANONYMOUS}=true and no caller authentication: every caller may submit to every queue"
            " (development only)"
        )
    if settings.config_file is not None:
        try:  # a broken queue file stops the service with one line naming the variable (exit 2), no traceback
            config = parse_config(yaml.safe_load(settings.config_file.read_text()))
        except (OSError, ValueError, OverflowError, yaml.YAMLError) as error:  # QueueConfigError is a ValueError
            raise ConfigError(f"KUMIKI_QUOTA_CONFIG_FILE: {one_line(error)}") from None
        version = await write_config(runtime.pool, config, str(settings.config_file))
        log.info("queue file applied", extra={"file": str(settings.config_file), "version": version})
    nodes = LiveNodes()  # what quota lends shrinks with the nodes that fail (docs/quota.md, "Live capacity")
    reader = TopicReader(runtime.settings.kafka, CLUSTER_STATE, nodes)
    await reader.start()
    await reader.catch_up()
    runtime.background.append(asyncio.create_task(reader.follow(runtime.stopping), name="follow-cluster-state"))
    runtime.closers.append(reader.stop)
    store = QuotaStore(runtime.pool, live=nodes.capacity)
    changed = asyncio.Event()
    quota_pb2_grpc.add_QuotaServicer_to_server(QuotaServicer(store, Authenticator(settings), changed), server)
    runtime.consume([JOB_LIFECYCLE], CONSUMER_GROUP, LedgerHandler(), exactly_once=True)
    publisher = Publisher(store, runtime.producer, changed, settings.state_interval_s, settings.half_life_s)
    runtime.background.append(asyncio.create_task(publisher.run(), name="quota-publisher"))


SPEC = ServiceSpec(
    name="quota",
    grpc_port=50053,
    http_port=8083,
    wire=wire,
    schema="quota",
    migrations="kumiki.quota.migrations",
    grpc_services=("kumiki.v1.Quota",),
)
