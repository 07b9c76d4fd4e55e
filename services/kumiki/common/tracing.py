"""OpenTelemetry set-up: spans go to OTLP (Jaeger) when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Trace context crosses Kafka in the W3C `traceparent` header, so one decision is one trace from the
gRPC call through every event it caused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import grpc
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

_configured: TracerProvider | None = None


def configure_tracing(service: str, otlp_endpoint: str | None, exporter: SpanExporter | None = None) -> TracerProvider:
    """Install the global tracer provider once; later calls return it (tests add exporters to it)."""
    global _configured
    if _configured is not None:
        if exporter is not None:
            _configured.add_span_processor(BatchSpanProcessor(exporter))
        return _configured
    provider = TracerProvider(resource=Resource.create({"service.name": f"kumiki-{service}"}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _configured = provider
    return provider


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

        async def traced(request, context):  # type: ignore[no-untyped-def]
            with tracer.start_as_current_span(method.lstrip("/"), context=parent, kind=trace.SpanKind.SERVER) as span:
                span.set_attribute("rpc.system", "grpc")
                span.set_attribute("rpc.method", method)
                try:
                    return await inner(request, context)
                finally:
                    code = context.code()
                    if code is not None and code != grpc.StatusCode.OK:
                        span.set_attribute("rpc.grpc.status_code", code.value[0])
                        span.set_status(trace.Status(trace.StatusCode.ERROR, str(context.details() or code.name)))

        return grpc.unary_unary_rpc_method_handler(
            traced, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer
        )


def outgoing_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context as gRPC metadata, for clients that call other services."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return tuple(carrier.items())
