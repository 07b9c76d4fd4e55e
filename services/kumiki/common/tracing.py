"""OpenTelemetry set-up: spans go to OTLP (Jaeger) when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Trace context crosses Kafka in the W3C `traceparent` header, so one decision is one trace from the
gRPC call through every event it caused. Span names and attributes follow the OpenTelemetry semantic
conventions for RPC (`kumiki.v1.Placement/Bind`, rpc.system/service/method, rpc.grpc.status_code) and for
messaging (`send TOPIC` PRODUCER, `process TOPIC` CONSUMER, messaging.system=kafka, destination, operation).
Sampling is the SDK's, from OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, checked here so a typo is a
configuration error instead of the SDK's silent fallback to sampling everything.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

import grpc
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace import sampling as otel_sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from kumiki.common.config import ConfigError

_configured: TracerProvider | None = None

SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
MESSAGING_SYSTEM = "kafka"


def sampler_from_env(environ: Mapping[str, str]) -> otel_sampling.Sampler:
    """OTEL_TRACES_SAMPLER (default parentbased_always_on) and, for the ratio samplers, OTEL_TRACES_SAMPLER_ARG
    (0..1, default 1). The parent-based ones follow the caller's decision, so a trace is kept or dropped whole."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in SAMPLERS:
        raise ConfigError(f"OTEL_TRACES_SAMPLER: expected one of {', '.join(SAMPLERS)}, got {name!r}")
    ratio = 1.0
    if name.endswith("traceidratio"):
        raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
        if raw:
            try:
                ratio = float(raw)
            except ValueError:
                raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in 0..1, got {raw!r}") from None
            if not 0.0 <= ratio <= 1.0:
                raise ConfigError(f"OTEL_TRACES_SAMPLER_ARG: expected a ratio in 0..1, got {raw!r}")
    chosen: otel_sampling.Sampler = {
        "always_on": otel_sampling.ALWAYS_ON,
        "always_off": otel_sampling.ALWAYS_OFF,
        "parentbased_always_on": otel_sampling.ParentBased(otel_sampling.ALWAYS_ON),
        "parentbased_always_off": otel_sampling.ParentBased(otel_sampling.ALWAYS_OFF),
    }.get(name) or (
        otel_sampling.TraceIdRatioBased(ratio)
        if name == "traceidratio"
        else otel_sampling.ParentBased(otel_sampling.TraceIdRatioBased(ratio))
    )
    return chosen


def configure_tracing(
    service: str,
    otlp_endpoint: str | None,
    exporter: SpanExporter | None = None,
    *,
    sampler: otel_sampling.Sampler | None = None,
) -> TracerProvider:
    """Install the global tracer provider once; later calls return it (tests add exporters to it).

    `service` becomes `service.name` = kumiki-<service>, which is what Jaeger lists and `kumiki trace` asks for."""
    global _configured
    if _configured is not None:
        if exporter is not None:
            _configured.add_span_processor(BatchSpanProcessor(exporter))
        return _configured
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"kumiki-{service}"}),
        sampler=sampler if sampler is not None else sampler_from_env(os.environ),
    )
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured = provider
    return provider


def shutdown_tracing() -> None:
    """Flush spans still in the batch processor (a short-lived process, the CLI, ends before its timer)."""
    if _configured is not None:
        _configured.force_flush(timeout_millis=5000)


def recording() -> bool:
    """Whether spans go anywhere; when not, hot paths skip making them (the trace context still travels)."""
    return _configured is not None


def inject_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka headers (traceparent, tracestate, baggage)."""
    if not trace.get_current_span().get_span_context().is_valid and not baggage.get_all():
        return []  # nothing to carry: skips the propagators, a few microseconds on every publish
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(key, value.encode()) for key, value in carrier.items()]


def extract_context(headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | Sequence[tuple[str, bytes]]):  # type: ignore[no-untyped-def]
    """The trace context carried by Kafka headers (empty context when there is none)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    carrier = {key: value.decode("latin-1") for key, value in pairs if key in ("traceparent", "tracestate")}
    return propagate.extract(carrier, context=otel_context.Context())


# ---- messaging (semantic conventions for messaging spans, Kafka) ---------------------------------------


def send_span_name(topics: Sequence[str]) -> str:
    """`send TOPIC`; a batch over several topics is just `send` (its destinations are an attribute)."""
    distinct = sorted(set(topics))
    return f"send {distinct[0]}" if len(distinct) == 1 else "send"


def send_attributes(topics: Sequence[str], count: int) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": ", ".join(sorted(set(topics))),
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    return attributes


def process_attributes(topic: str, group: str, partition: int, offset: int, key: bytes | None) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(partition),
        "messaging.consumer.group.name": group,
        "messaging.kafka.offset": offset,
    }
    if key:
        attributes["messaging.kafka.message.key"] = key.decode("utf-8", "replace")
    return attributes


# ---- gRPC (semantic conventions for RPC spans) ----------------------------------------------------------


def _rpc_attributes(full_method: str) -> dict[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


class ServerTracingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A SERVER span around every unary gRPC call, continuing the caller's trace (W3C traceparent metadata).

    Events published while handling the call are children of this span, and their consumers continue it:
    one decision, one trace, from the caller through every service it touched.
    """

    def __init__(self, service: str) -> None:
        self.tracer = trace.get_tracer(f"kumiki.{service}")

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        method = handler_call_details.method
        carrier = {
            key: value
            for key, value in (handler_call_details.invocation_metadata or ())
            if key in ("traceparent", "tracestate") and isinstance(value, str)
        }
        if not carrier and not recording():
            return handler  # nothing to record and no caller's trace to pass on
        parent = propagate.extract(carrier, context=otel_context.Context())
        inner = handler.unary_unary
        tracer = self.tracer
        attributes = _rpc_attributes(method)

        async def traced(request, context):  # type: ignore[no-untyped-def]
            with tracer.start_as_current_span(
                method.lstrip("/"), context=parent, kind=trace.SpanKind.SERVER, attributes=attributes
            ) as span:
                try:
                    return await inner(request, context)
                finally:
                    code = context.code()
                    status = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.OK
                    span.set_attribute("rpc.grpc.status_code", status.value[0])
                    if status != grpc.StatusCode.OK:
                        span.set_status(trace.Status(trace.StatusCode.ERROR, str(context.details() or status.name)))

        return grpc.unary_unary_rpc_method_handler(
            traced, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


class ClientTracingInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """A CLIENT span around every unary call on a channel, its context sent as traceparent metadata.

    With no tracer provider and no current trace it only passes the call on (no span, no metadata)."""

    def __init__(self, address: str, component: str = "kumiki") -> None:
        host, _, port = address.rpartition(":")
        self.server_attributes: dict[str, str | int] = {"server.address": host or address}
        if port.isdigit():
            self.server_attributes["server.port"] = int(port)
        self.tracer = trace.get_tracer(f"kumiki.{component}")

    async def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        if not recording() and not trace.get_current_span().get_span_context().is_valid:
            return await continuation(client_call_details, request)
        method = client_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        attributes: dict[str, str | int] = {**_rpc_attributes(method), **self.server_attributes}
        with self.tracer.start_as_current_span(
            method.lstrip("/"), kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            metadata = [*(client_call_details.metadata or ()), *outgoing_metadata()]
            details = grpc.aio.ClientCallDetails(
                client_call_details.method,
                client_call_details.timeout,
                metadata,
                client_call_details.credentials,
                client_call_details.wait_for_ready,
            )
            call = await continuation(details, request)
            try:
                await call
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(error.details() or code.name)))
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            return call


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata, for clients that call other services."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())


# ---- trace context kept with durable work (an outbox row, a stored protocol) -----------------------------


def current_traceparent() -> str:
    """The current span's W3C traceparent ('' without a valid one), to store with work carried out later."""
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def context_from_traceparent(traceparent: str) -> otel_context.Context:
    """The context a stored traceparent names (empty when there is none or it does not parse), so work done
    later, or by a restarted process, is a child of the step that decided it."""
    return propagate.extract({"traceparent": traceparent} if traceparent else {}, context=otel_context.Context())
