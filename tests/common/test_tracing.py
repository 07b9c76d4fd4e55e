"""One decision, one trace: a caller's span → placement's Bind span → the published events → a consumer.

Spans leave the placement process over OTLP/gRPC, as they would to Jaeger; the receiver here is built on
opentelemetry-proto's own TraceService (the closest maintained stand-in for Jaeger's OTLP endpoint).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from kumiki.common.bus import Event, EventConsumer, EventProducer
from kumiki.common.bus.topics import JOB_LIFECYCLE
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import placement_pb2, placement_pb2_grpc
from kumiki.common.tracing import configure_tracing, outgoing_metadata
from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import readiness
from tests.conftest import wait_until
from tests.placement.support import bind_request, default_nodes, emulate, placement_process_env, whole

configure_tracing("test", None)


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list = []  # type: ignore[type-arg]

    async def Export(self, request, context):  # type: ignore[no-untyped-def]
        for resource in request.resource_spans:
            service = next(a.value.string_value for a in resource.resource.attributes if a.key == "service.name")
            for scope in resource.scope_spans:
                self.spans.extend((service, span) for span in scope.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def ready(http_port: int) -> bool:
    return readiness(http_port)[0] == "ready"


@pytest.mark.parametrize("exporting", [True, False], ids=["otlp", "no-exporter"])
async def test_bind_is_one_trace_from_caller_to_consumer(kafka: KafkaSettings, tmp_path: Path, exporting: bool) -> None:
    """Without an exporter the service records no spans, yet the caller's trace still reaches the consumer."""
    receiver = Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    otlp_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await emulate(kafka, default_nodes(2))
    grpc_port, http_port = free_port(), free_port()
    env = placement_process_env(kafka, grpc_port, http_port)
    if exporting:
        env |= {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    with (tmp_path / "placement.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "kumiki.placement"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    consumed: list[int] = []

    async def handler(event: Event, connection: object) -> None:
        consumed.append(trace.get_current_span().get_span_context().trace_id)

    try:
        await wait_until(lambda: ready(http_port), timeout_s=60, what="placement")
        async with EventProducer(kafka, "//kumiki/test") as producer:
            consumer = EventConsumer(kafka, [JOB_LIFECYCLE], "trace-test", handler, producer)
            await consumer.start()
            consuming = asyncio.create_task(consumer.run())
            with trace.get_tracer("test").start_as_current_span("binder reconcile") as root:
                trace_id = root.get_span_context().trace_id
                async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                    reply = await placement_pb2_grpc.PlacementStub(channel).Bind(
                        bind_request("traced-job", [whole(2)]), metadata=outgoing_metadata()
                    )
            assert reply.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
            await wait_until(lambda: consumed, timeout_s=30, what="the lifecycle event")
            consumer.request_stop()
            await consuming
            await consumer.stop()

        def ours() -> list:  # type: ignore[type-arg]
            return [
                (service, span) for service, span in receiver.spans if int.from_bytes(span.trace_id, "big") == trace_id
            ]

        if exporting:
            await wait_until(lambda: len(ours()) >= 3, timeout_s=30, what="placement's spans over OTLP")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        await server.stop(None)
    assert consumed == [trace_id], "the consumer's span continues the same trace"
    if not exporting:
        return
    spans = {span.name: (service, span) for service, span in ours()}
    service, bind = spans["kumiki.v1.Placement/Bind"]
    assert service == "kumiki-placement"
    assert int.from_bytes(bind.parent_span_id, "big") == root.get_span_context().span_id
    # both of the bind's events (job.lifecycle and scheduling.decisions) go out under one PRODUCER span, a
    # child of the decision's span ("schedule"), which is the Bind span's child
    schedule = spans["schedule"][1]
    assert schedule.parent_span_id == bind.span_id
    publish = spans["send"][1]
    assert publish.kind == publish.SPAN_KIND_PRODUCER
    destinations = next(a.value.string_value for a in publish.attributes if a.key == "messaging.destination.name")
    assert destinations == f"{kafka.topic_prefix}job.lifecycle, {kafka.topic_prefix}scheduling.decisions"
    assert publish.parent_span_id == schedule.span_id, "the event is published inside the decision's span"
    assert consumed == [trace_id], "the consumer's span continues the same trace"


def test_inject_headers_carries_what_there_is_and_nothing_else() -> None:
    """The fast path for 'nothing to carry' must not drop baggage or a span's context."""
    from opentelemetry import baggage
    from opentelemetry import context as otel_context

    from kumiki.common.tracing import inject_headers

    assert inject_headers() == []
    token = otel_context.attach(baggage.set_baggage("tenant", "team-a"))
    try:
        assert inject_headers() == [("baggage", b"tenant=team-a")]
    finally:
        otel_context.detach(token)
    with trace.get_tracer("test").start_as_current_span("decide") as span:
        headers = dict(inject_headers())
    assert f"{span.get_span_context().trace_id:032x}" in headers["traceparent"].decode()


def test_sampler_comes_from_the_environment_and_a_bad_value_names_the_variable() -> None:
    from opentelemetry.sdk.trace import sampling

    from kumiki.common.config import ConfigError
    from kumiki.common.tracing import sampler_from_env

    assert sampler_from_env({}).get_description() == sampling.ParentBased(sampling.ALWAYS_ON).get_description()
    ratio = sampler_from_env({"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert "TraceIdRatioBased{0.25}" in ratio.get_description()
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"}) is sampling.ALWAYS_OFF
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER: expected one of"):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratoi"})
    for bad in ("half", "1.5", "-0.1"):
        with pytest.raises(ConfigError, match=r"OTEL_TRACES_SAMPLER_ARG: expected a ratio in 0\.\.1"):
            sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": bad})
