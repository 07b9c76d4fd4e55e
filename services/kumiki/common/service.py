"""The imperative shell every service shares: config, logs, traces, bus, database, gRPC, health, metrics.

A service describes itself with a `ServiceSpec` (name, ports, schema, consumed topics, gRPC servicers)
and `run_service` does the rest, so a reader who knows one service's `app.py` knows all five.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import asyncpg
import grpc
from aiohttp import web
from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from kumiki.common.bus import ALL_TOPICS, EventConsumer, EventProducer, TopicSpec, ensure_topics
from kumiki.common.bus.access import ACCESS, Access
from kumiki.common.bus.admin import BrokerUnavailable, refused_by_authorizer
from kumiki.common.bus.consumer import Handler
from kumiki.common.config import EXIT_PORT_IN_USE, ConfigError, PortInUse, Settings, service_prefix
from kumiki.common.db import DatabaseUnavailable, MigrationError, apply_migrations, create_pool
from kumiki.common.grpcutil import RequestGuard
from kumiki.common.logs import configure_logging
from kumiki.common.taskdump import dump_tasks_on_signal
from kumiki.common.tracing import ServerTracingInterceptor, configure_tracing, sampler_from_env

log = logging.getLogger(__name__)

GRACE_S = 3.0  # for background loops to notice `stopping` and return
STOP_TIMEOUT_S = 10.0  # for cancelled ones
UP = Gauge("kumiki_service_ready", "1 when the service is ready", ["service"])


@dataclass
class Runtime:
    """What a service's wiring gets to work with once the shell has started."""

    settings: Settings
    producer: EventProducer
    pool: asyncpg.Pool | None
    consumers: list[EventConsumer] = field(default_factory=list)
    background: list[asyncio.Task[Any]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # run at stop, after background
    components: dict[str, object] = field(default_factory=dict)
    # set when the service stops: loops check it, since a cancellation can be lost (asyncio.wait_for in 3.11)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # what the wiring built, by name (tests, debugging)
    access: Access | None = None  # the service's share of the bus (kumiki.common.bus.access); None: all of it

    def consume(
        self, specs: Sequence[TopicSpec], group: str, handler: Handler, *, exactly_once: bool = False
    ) -> EventConsumer:
        if self.access is not None:
            self.access.check_consumer(specs, group)
        consumer = EventConsumer(
            self.settings.kafka, specs, group, handler, self.producer, pool=self.pool if exactly_once else None
        )
        self.consumers.append(consumer)
        return consumer


# A service's wiring: given the runtime and the gRPC server, register servicers and consumers.
Wiring = Callable[[Runtime, grpc.aio.Server], Awaitable[None]]


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    grpc_port: int
    http_port: int
    wire: Wiring
    schema: str | None = None  # Postgres schema; None = the service needs no database
    migrations: str | None = None  # package holding NNNN_name.sql files
    grpc_services: tuple[str, ...] = ()  # full names, for health and reflection


class ServiceHost:
    """Starts and stops one service; `ready` is what /readyz and gRPC health report."""

    def __init__(self, spec: ServiceSpec, settings: Settings) -> None:
        self.spec = spec
        self.settings = settings
        self.ready = False
        self.runtime: Runtime | None = None
        self.grpc_server: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.grpc_port = 0
        self.http_port = 0
        self._http_runner: web.AppRunner | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        settings = self.settings
        await self._start_http()  # liveness first, so a slow broker shows up as not-ready, not dead
        # the gRPC port next, before seconds of database and broker work: a port checked free by whoever started
        # this process can meanwhile become an outgoing connection's source port (50051-50055 lie in Linux's
        # ephemeral range); services are registered on it below, and it serves from start(). The guard sits
        # inside the tracing span, so a rejected request's span shows INVALID_ARGUMENT.
        interceptors = [ServerTracingInterceptor(self.spec.name), RequestGuard(self.spec.name)]
        self.grpc_server = grpc.aio.server(interceptors=interceptors)
        self.grpc_port = self._bind_grpc(self.grpc_server)
        pool = None
        if self.spec.schema is not None:
            pool = await create_pool(settings.database)
            await apply_migrations(pool, "kumiki_bus", "kumiki.common.migrations")
            if self.spec.migrations:
                await apply_migrations(pool, self.spec.schema, self.spec.migrations)
        access = ACCESS.get(self.spec.name)  # on a broker with ACLs it may create and write only these
        await ensure_topics(settings.kafka, access.topics if access else ALL_TOPICS)
        source = f"//kumiki/{self.spec.name}/{settings.instance}"
        producer = EventProducer(settings.kafka, source, writes=access.writes if access else None)
        await producer.start()
        self.runtime = Runtime(settings, producer, pool, access=access)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        await self.spec.wire(self.runtime, self.grpc_server)
        await self.grpc_server.start()
        for consumer in self.runtime.consumers:
            await consumer.start()
            self.runtime.background.append(asyncio.create_task(consumer.run(), name=f"consume-{consumer.group_id}"))
        for name in ("", *self.spec.grpc_services):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.ready = True
        UP.labels(self.spec.name).set(1)
        log.info(
            "service ready",
            extra={
                "grpc_port": self.grpc_port,
                "http_port": self.http_port,
                "kafka": settings.kafka.bootstrap,
                "database": settings.database.redacted() if pool else "none",
            },
        )

    def _bind_grpc(self, server: grpc.aio.Server) -> int:
        server_settings = self.settings.server
        address = f"{server_settings.host}:{server_settings.grpc_port}"
        if server_settings.tls_certfile and server_settings.tls_keyfile:
            cafile = server_settings.tls_client_cafile
            credentials = grpc.ssl_server_credentials(
                [(server_settings.tls_keyfile.read_bytes(), server_settings.tls_certfile.read_bytes())],
                root_certificates=cafile.read_bytes() if cafile else None,
                require_client_auth=cafile is not None,
            )
            bind = partial(server.add_secure_port, address, credentials)
        else:
            bind = partial(server.add_insecure_port, address)
        try:
            return int(bind())
        except RuntimeError as error:  # grpc's only word: "Failed to bind to address ...; set GRPC_VERBOSITY..."
            cause = str(error).partition(";")[0]
            raise PortInUse(f"{self._port_variable('GRPC')}: cannot listen on {address}: {cause}") from None

    def _port_variable(self, kind: str) -> str:
        return f"{service_prefix(self.spec.name)}_{kind}_PORT"

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        self._http_runner = web.AppRunner(app, access_log=None)
        await self._http_runner.setup()
        site = web.TCPSite(self._http_runner, self.settings.server.host, self.settings.server.http_port)
        try:
            await site.start()
        except OSError as error:
            address = f"{self.settings.server.host}:{self.settings.server.http_port}"
            raise PortInUse(f"{self._port_variable('HTTP')}: cannot listen on {address}: {error}") from None
        server = site._server
        assert server is not None
        self.http_port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive", "service": self.spec.name})

    def _failed_task(self) -> str | None:
        for task in self.runtime.background if self.runtime else []:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return f"{task.get_name()}: {task.exception()!r}"
        return None

    async def _readyz(self, request: web.Request) -> web.Response:
        failed = self._failed_task()
        ready = self.ready and failed is None
        body = {
            "status": "ready" if ready else "not ready",
            "service": self.spec.name,
            "grpc_port": self.grpc_port,
            "kafka": self.settings.kafka.bootstrap,
            "database": self.settings.database.redacted() if self.spec.schema else None,
        }
        if failed:
            body["error"] = failed
        return web.json_response(body, status=200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def wait(self) -> None:
        """Until stop() or a background task dies (then raise: the process exits and is restarted)."""
        while not self._stopped.is_set():
            failed = self._failed_task()
            if failed:
                raise RuntimeError(f"background task failed: {failed}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), timeout=1.0)

    async def stop(self) -> None:
        self.ready = False
        UP.labels(self.spec.name).set(0)
        await self.health.enter_graceful_shutdown()
        if self.runtime:
            for consumer in self.runtime.consumers:
                consumer.request_stop()
            self.runtime.stopping.set()
            if self.runtime.background:  # let loops finish what they are doing (a bind being published)
                await asyncio.wait(self.runtime.background, timeout=GRACE_S)
            for task in self.runtime.background:
                task.cancel()
            if self.runtime.background:
                _, stuck = await asyncio.wait(self.runtime.background, timeout=STOP_TIMEOUT_S)
                for task in stuck:  # never hang a shutdown on a task that ignored its cancellation
                    log.error("background task did not stop", extra={"task": task.get_name()})
            for consumer in self.runtime.consumers:
                await consumer.stop()
            for close in self.runtime.closers:
                await close()
        if self.grpc_server:
            await self.grpc_server.stop(grace=2.0)
        if self.runtime:
            await self.runtime.producer.stop()
            if self.runtime.pool:
                await self.runtime.pool.close()
        if self._http_runner:
            await self._http_runner.cleanup()
        self._stopped.set()


async def _serve(spec: ServiceSpec, settings: Settings) -> None:
    host = ServiceHost(spec, settings)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop_requested.set)
    dump_tasks_on_signal(f"kumiki-{spec.name}")
    try:
        await host.start()
        waiter = asyncio.create_task(host.wait())
        stopper = asyncio.create_task(stop_requested.wait())
        done, _ = await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if waiter in done:
            waiter.result()
        waiter.cancel()
    finally:
        await host.stop()


def run_service(spec: ServiceSpec, argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m kumiki.<service>`: exit 2 with one line on bad configuration."""
    try:
        settings = Settings.from_env(spec.name, grpc_port=spec.grpc_port, http_port=spec.http_port)
        sampler = sampler_from_env(os.environ)  # OTEL_TRACES_SAMPLER[_ARG]: a typo is an error, not "sample all"
    except ConfigError as error:
        print(f"kumiki-{spec.name}: configuration error: {error}", file=sys.stderr)
        return 2
    configure_logging(spec.name, settings.log_level)
    if settings.otlp_endpoint:
        # Without an exporter, recording spans would cost every call CPU for nothing. The no-op tracer still
        # hands the caller's traceparent on to the events a call publishes.
        configure_tracing(spec.name, settings.otlp_endpoint, sampler=sampler)
    try:
        asyncio.run(_serve(spec, settings))
    except ConfigError as error:  # found while wiring (a service's own variables): the same one line
        print(f"kumiki-{spec.name}: configuration error: {error}", file=sys.stderr)
        return 2
    except (BrokerUnavailable, DatabaseUnavailable, MigrationError) as error:
        print(f"kumiki-{spec.name}: {error}", file=sys.stderr)
        return 3
    except (GroupAuthorizationFailedError, TopicAuthorizationFailedError) as error:  # a broker's ACLs, while running
        print(f"kumiki-{spec.name}: {refused_by_authorizer(settings.kafka, error)}", file=sys.stderr)
        return 3
    except PortInUse as error:
        print(f"kumiki-{spec.name}: {error}", file=sys.stderr)
        return EXIT_PORT_IN_USE
    except KeyboardInterrupt:
        pass
    return 0
