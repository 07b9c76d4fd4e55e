"""One decision, one trace, in a real Jaeger: a caller's Bind through placement, quota and forecast running as
processes, over gRPC and Apache Kafka, read back from Jaeger's query API.

What is checked is the tree Jaeger stores (parent by parent, process by process), the span kinds, and the
OpenTelemetry semantic-convention attributes for RPC and messaging; and that sampling is configurable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace

from kumiki.cli.trace import find_traces
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import placement_pb2, placement_pb2_grpc
from kumiki.common.tracing import ClientTracingInterceptor, shutdown_tracing
from kumiki.devstack.observability import JaegerProcess
from tests.conftest import wait_until
from tests.observability.support import collected, live_stack
from tests.placement.support import bind_request, default_nodes, emulate, whole


def traced_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, interceptors=[ClientTracingInterceptor(address, "test")])


async def decide(stub: placement_pb2_grpc.PlacementStub, request: placement_pb2.BindRequest) -> tuple[int, Any]:
    """The caller's span (a binder reconciling a pod group) around one Bind; returns its trace id and reply."""
    with trace.get_tracer("test").start_as_current_span("reconcile pod group") as root:
        reply = await stub.Bind(request)
    shutdown_tracing()  # the test's own spans go to Jaeger now
    return root.get_span_context().trace_id, reply


async def test_bind_is_one_trace_in_jaeger_across_processes(
    kafka: KafkaSettings, database_settings: DatabaseSettings, jaeger: JaegerProcess, tmp_path: Path
) -> None:
    await emulate(kafka, default_nodes(4))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint}
    with live_stack(kafka, database_settings, tmp_path, env) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement, quota and forecast ready")
        async with traced_channel(stack.services["placement"].grpc_address) as channel:
            stub = placement_pb2_grpc.PlacementStub(channel)
            bound_trace, bound = await decide(stub, bind_request("traced-bound", [whole(2, "A100-80GB")]))
            # team-b may hold 4 GPUs: 8 wait for quota, and the job's arrival is an event forecast answers
            held_trace, held = await decide(stub, bind_request("traced-held", [whole(8)], queue="team-b"))
        assert bound.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
        assert held.outcome == placement_pb2.BindResponse.OUTCOME_PENDING
        prefix = kafka.topic_prefix
        lifecycle = f"process {prefix}job.lifecycle"

        tree = await collected(
            jaeger,
            bound_trace,
            lambda t: t.has(lifecycle, "kumiki-quota") and t.has(lifecycle, "kumiki-forecast"),
            "the bound job's trace with both consumers",
        )
        # caller -> Bind CLIENT -> Bind SERVER -> schedule -> (Quota.Admit CLIENT -> SERVER -> admit), send -> consumers
        root = tree.find("reconcile pod group", "kumiki-test")
        assert tree.spans[root]["parent"] is None
        client = tree.find("kumiki.v1.Placement/Bind", "kumiki-test", root)
        server = tree.find("kumiki.v1.Placement/Bind", "kumiki-placement", client)
        assert (tree.spans[client]["kind"], tree.spans[server]["kind"]) == ("client", "server")
        for span in (client, server):
            tags = tree.tags(span)
            assert (tags["rpc.system"], tags["rpc.service"], tags["rpc.method"]) == (
                "grpc",
                "kumiki.v1.Placement",
                "Bind",
            )
            assert tags["rpc.grpc.status_code"] == 0
        assert tree.tags(client)["server.port"] == stack.services["placement"].grpc_port
        schedule = tree.find("schedule", "kumiki-placement", server)
        decision = tree.tags(schedule)
        assert decision["kumiki.job.id"] == "traced-bound" and decision["kumiki.queue"] == "team-a"
        assert decision["kumiki.gpus"] == 2 and decision["kumiki.outcome"] == "bound"
        assert decision["kumiki.quota.admitted"] is True
        assert decision["kumiki.nodes"], "the chosen nodes are on the decision"
        admit_client = tree.find("kumiki.v1.Quota/Admit", "kumiki-placement", schedule)
        admit_server = tree.find("kumiki.v1.Quota/Admit", "kumiki-quota", admit_client)
        assert tree.spans[admit_server]["kind"] == "server"
        admit = tree.find("admit", "kumiki-quota", admit_server)
        assert tree.tags(admit)["kumiki.quota.outcome"] == "admitted"
        send = tree.find("send", "kumiki-placement", schedule)
        sent = tree.tags(send)
        assert tree.spans[send]["kind"] == "producer"
        assert sent["messaging.system"] == "kafka" and sent["messaging.operation.type"] == "send"
        assert sent["messaging.destination.name"] == f"{prefix}job.lifecycle, {prefix}scheduling.decisions"
        assert sent["messaging.batch.message_count"] == 2
        # admission happens before the events go out: the decision's children in time order
        assert tree.spans[admit_client]["start"] < tree.spans[send]["start"]
        for service, group in (("kumiki-quota", "kumiki-quota"), ("kumiki-forecast", "kumiki-forecast")):
            consumed = tree.find(lifecycle, service, send)
            tags = tree.tags(consumed)
            assert tree.spans[consumed]["kind"] == "consumer"
            assert tags["messaging.consumer.group.name"] == group
            assert tags["messaging.operation.type"] == "process"
            assert tags["messaging.kafka.message.key"] == "traced-bound"
        services = {span["service"] for span in tree.spans.values()}
        assert services == {"kumiki-test", "kumiki-placement", "kumiki-quota", "kumiki-forecast"}

        # the held job: quota says no (the reason is on the decision), its arrival is forecast, and the
        # forecast's own event is a grandchild over Kafka: placement -> Kafka -> forecast -> Kafka
        forecast_send = f"send {prefix}job.forecast"
        tree = await collected(
            jaeger,
            held_trace,
            lambda t: t.has(forecast_send, "kumiki-forecast") and t.has(lifecycle, "kumiki-quota"),
            "the held job's trace through forecast",
        )
        server = tree.find("kumiki.v1.Placement/Bind", "kumiki-placement")
        schedule = tree.find("schedule", "kumiki-placement", server)
        decision = tree.tags(schedule)
        assert decision["kumiki.outcome"] == "pending" and decision["kumiki.pending.resource"] == "quota"
        assert "team-b" in decision["kumiki.pending.reason"]
        assert decision["kumiki.quota.admitted"] is False
        admit_client = tree.find("kumiki.v1.Quota/Admit", "kumiki-placement", schedule)
        admit = tree.find("admit", "kumiki-quota", tree.find("kumiki.v1.Quota/Admit", "kumiki-quota", admit_client))
        assert tree.tags(admit)["kumiki.quota.admitted"] is False
        send = tree.find("send", "kumiki-placement", schedule)
        forecast_consumed = tree.find(lifecycle, "kumiki-forecast", send)
        tree.find(forecast_send, "kumiki-forecast", forecast_consumed, **{"messaging.system": "kafka"})


@pytest.mark.parametrize(
    ("sampler", "argument", "kept"),
    [("parentbased_traceidratio", "0", False), ("parentbased_traceidratio", "1", True)],
    ids=["ratio-0", "ratio-1"],
)
async def test_sampling_is_configurable_and_keeps_traces_whole(
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    jaeger: JaegerProcess,
    tmp_path: Path,
    sampler: str,
    argument: str,
    kept: bool,
) -> None:
    """A ratio of 0 at placement records nothing of an unsampled caller's decision; 1 records all of it.

    The caller's own decision (sampled flag in traceparent) is what parent-based samplers follow, so a busy
    cluster sets the ratio where traces start (the binder, the CLI) and keeps traces whole."""
    await emulate(kafka, default_nodes(2))
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
        "OTEL_TRACES_SAMPLER": sampler,
        "OTEL_TRACES_SAMPLER_ARG": argument,
    }
    with live_stack(kafka, database_settings, tmp_path, env, names=("placement",)) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement ready")
        # no caller span: placement's Bind span is the root, so its own sampler decides
        async with grpc.aio.insecure_channel(stack.services["placement"].grpc_address) as channel:
            stub = placement_pb2_grpc.PlacementStub(channel)
            reply = await stub.Bind(bind_request(f"sampled-{argument}", [whole(1)]))
            assert reply.outcome == placement_pb2.BindResponse.OUTCOME_BOUND
    # stopping the service flushed its batch processor: what Jaeger has now is all there will be
    assert bool(find_traces(jaeger.query_url, f"sampled-{argument}", 600, 5)) is kept
