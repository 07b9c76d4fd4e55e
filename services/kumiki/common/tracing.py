"""OpenTelemetry set-up: spans go to OTLP (Jaeger) when OTEL_EXPORTER_OTLP_ENDPOINT is set.

Trace context crosses Kafka in the W3C `traceparent` header, so one decision is one trace from the
gRPC call through every event it caused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
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


def inject_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka headers (traceparent, tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(key, value.encode()) for key, value in carrier.items()]


def extract_context(headers: Iterable[tuple[str, bytes]] | Mapping[str, bytes] | Sequence[tuple[str, bytes]]):  # type: ignore[no-untyped-def]
    """The trace context carried by Kafka headers (empty context when there is none)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    carrier = {key: value.decode("latin-1") for key, value in pairs if key in ("traceparent", "tracestate")}
    return propagate.extract(carrier, context=otel_context.Context())
