"""Telemetry ingest wiring: the faust application runs inside the shared service shell.

The shell (kumiki.common.service) gives it what every service has: configuration errors as one line,
JSON logs, traces, topic creation, the bus EventProducer, /healthz, /readyz and /metrics. faust's own
worker (signal handling, its web server, logging set-up) is not used: `TelemetryStreams.start()` runs
the faust App as a background service in the shell's event loop, and /readyz turns red if it crashes.
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc

from kumiki.common.bus import ensure_topics
from kumiki.common.bus.topics import NODE_INVENTORY
from kumiki.common.config import env_float
from kumiki.common.service import Runtime, ServiceSpec
from kumiki.telemetry.adapters.agent_identity import AgentIdentity
from kumiki.telemetry.adapters.gc_policy import TimedCollection
from kumiki.telemetry.adapters.streams import TelemetryStreams
from kumiki.telemetry.core import TelemetryConfig

RECOVERY_TIMEOUT_S = 120.0
log = logging.getLogger(__name__)
COMMIT_STALL_S = 60.0  # records behind an unmoving committed offset this long: exit, a restart reads them again


async def _watch(streams: TelemetryStreams) -> None:
    """Lives as long as the faust app; raising here makes /readyz fail and the process exit. Once the tables
    are rebuilt, it hands garbage collection to a timer (gc_policy: a third of the worker's CPU otherwise)."""
    collection = TimedCollection()
    try:
        while True:
            reason = streams.crash_reason()
            if reason is not None:
                raise RuntimeError(f"faust app crashed: {reason!r}")
            if not collection.started and streams.recovered:
                collection.start()
            await asyncio.sleep(1.0)
    finally:
        await collection.stop()
        await streams.stop()


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    config = TelemetryConfig.from_env(os.environ)
    stall_s = env_float(os.environ, "KUMIKI_TELEMETRY_COMMIT_STALL_S", COMMIT_STALL_S, minimum=0, maximum=86400)
    if runtime.settings.log_level != "DEBUG":  # faust and mode narrate every start step at INFO
        for name in ("faust", "mode"):
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger().level))
    agent_identity = AgentIdentity.from_env(os.environ)  # None: no agent's proof required
    if agent_identity is not None:
        log.info("agents must prove their node", extra=agent_identity.describe())
    await ensure_topics(runtime.settings.kafka, [NODE_INVENTORY])
    streams = TelemetryStreams(
        runtime.settings.kafka, config, runtime.producer, commit_stall_s=stall_s, agent_identity=agent_identity
    )
    await streams.start()
    runtime.background.append(asyncio.create_task(_watch(streams), name="faust-telemetry"))
    # Ready means the tables are rebuilt from their changelogs: before that, state would be published from
    # an empty table.
    await streams.wait_recovered(RECOVERY_TIMEOUT_S)


SPEC = ServiceSpec(name="telemetry-ingest", grpc_port=50055, http_port=8085, wire=wire)
