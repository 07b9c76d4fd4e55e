"""One pod group, one trace, from the cluster to the API server, in a real Jaeger.

A real kube-apiserver v1.37.2 (etcd v3.7.0) with KWOK nodes, the binder, placement, quota, forecast and the
preemption coordinator as processes over Apache Kafka and Postgres, every one exporting to Jaeger v2. A PodGroup
and its pods are created through the API; what is checked is the tree Jaeger stores, parent by parent and
process by process: the binder's span for the pod group -> Placement.Bind (client, server) -> the scheduling
pass -> Quota.Admit -> the Kafka send -> each consumer's `process` span (quota's ledger, forecast, the
preemption coordinator), and the binder's Binding POSTs to the API server, after Placement answered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.scheduling_v1 import PriorityClass

from kumiki.binder import core
from kumiki.cli.trace import find_traces
from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.tracing import shutdown_tracing
from kumiki.devstack.kube import KubeStack
from kumiki.devstack.observability import JaegerProcess
from kumiki.sdk import Job
from tests.binder.support import Processes, create_all, namespace, node_object, pod_object, podgroup_object, pods_in
from tests.conftest import wait_until
from tests.observability.support import Tree, collected, live_stack
from tests.observability.test_jaeger_preemption import (
    command_sends,
    decision_to_checkpoint,
    requeue_and_rebind,
    resumed,
    stack_env,
)
from tests.observability.test_trace_cli import kumiki

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

BINDING = "POST /api/v1/namespaces/{namespace}/pods/{name}/binding"
EVICTION = "POST /api/v1/namespaces/{namespace}/pods/{name}/eviction"
CONSUMERS = ("kumiki-quota", "kumiki-forecast", "kumiki-preemption")


def tracing_env(jaeger: JaegerProcess) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


async def nodes_ready(kube: AsyncClient, count: int) -> bool:
    listed = [node.to_dict() async for node in kube.list(Node)]
    return len(listed) == count and all(core.parse_node(node).schedulable for node in listed)


async def bound(kube: AsyncClient, ns: str, prefix: str, count: int) -> bool:
    pods = [pod for pod in await pods_in(kube, ns) if pod["metadata"]["name"].startswith(prefix)]
    return len(pods) == count and all(pod["spec"].get("nodeName") for pod in pods)


def spans_named(tree: Tree, name: str, service: str, parent: str | None = None) -> list[str]:
    return [
        span_id
        for span_id, span in tree.spans.items()
        if span["name"] == name and span["service"] == service and (parent is None or span["parent"] == parent)
    ]


def complete(prefix: str, pods: int) -> Any:
    """Every consumer's span and every Binding is in (they come from five processes, in batches)."""
    lifecycle = f"process {prefix}job.lifecycle"
    return lambda tree: (
        len(spans_named(tree, BINDING, "kumiki-binder")) == pods
        and all(spans_named(tree, lifecycle, service) for service in CONSUMERS)
    )


async def the_trace(jaeger: JaegerProcess, job_id: str, operation: str | None = None) -> int:
    """The one trace that holds the job's decision (a gang submitted twice would be two); with `operation`, the
    one of its traces that holds a span of that name (a preempting decision: its later bind is a trace of its
    own)."""
    found: list[list[dict[str, Any]]] = []

    def one() -> bool:
        traces = find_traces(jaeger.query_url, job_id, 600, 20)
        if operation is not None:
            traces = [data for data in traces if any(s["operationName"] == operation for s in data["spans"])]
        found[:] = [traces]
        return bool(found[0])

    await wait_until(one, timeout_s=30, interval_s=0.3, what=f"a decision trace for {job_id} in Jaeger")
    assert len(found[0]) == 1, f"{len(found[0])} traces hold {job_id}'s decision"
    return int(found[0][0]["traceID"], 16)


async def test_a_pod_group_is_one_trace_from_the_binder_to_the_binding(
    kube: AsyncClient,
    kube_stack: KubeStack,
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    jaeger: JaegerProcess,
    tmp_path: Path,
) -> None:
    await create_all(kube, [node_object(f"gpu-{index}", 8) for index in range(2)])
    await wait_until(lambda: nodes_ready(kube, 2), timeout_s=60, interval_s=0.3, what="KWOK to make the nodes Ready")
    env = {**tracing_env(jaeger), "KUMIKI_PLACEMENT_CYCLE_S": "0.2"}
    names = ("quota", "forecast", "preemption", "placement")
    with live_stack(kafka, database_settings, tmp_path / "stack", env, names=names) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement, quota, forecast, preemption")
        binder = Processes(kube_stack, kafka, tmp_path)
        binder.placement_port = stack.services["placement"].grpc_port
        try:
            await binder.start_binder(True, **tracing_env(jaeger), KUMIKI_LOG_LEVEL="WARNING")
            ns = await namespace(kube)
            # a first pod, bound once Placement has the binder's node records: the traced gang below is then
            # decided at once (not left pending for the scheduling pass, a trace of its own)
            await create_all(kube, [pod_object(ns, "warm", gpus=1, labels={core.QUEUE_LABEL: "team-a"})])
            await wait_until(lambda: bound(kube, ns, "warm", 1), timeout_s=60, interval_s=0.3, what="warm bound")
            group = [podgroup_object(ns, "train", 2)]
            group += [
                pod_object(ns, f"train-{i}", gpus=2, group="train", labels={core.QUEUE_LABEL: "team-a"})
                for i in range(2)
            ]
            await create_all(kube, group)
            await wait_until(lambda: bound(kube, ns, "train-", 2), timeout_s=60, interval_s=0.3, what="gang bound")
            job_id = f"{ns}/train"
            trace_id = await the_trace(jaeger, job_id)
            tree = await collected(jaeger, trace_id, complete(kafka.topic_prefix, 2), "the pod group's whole trace")
        finally:
            binder.stop()
            print(binder.logs())
    placed = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in await pods_in(kube, ns)}
    prefix = kafka.topic_prefix

    # the binder's span for the pod group is the root
    root = tree.find("reconcile pod group", "kumiki-binder")
    assert tree.spans[root]["parent"] is None
    gang = tree.tags(root)
    assert gang["kumiki.job.id"] == job_id and gang["kumiki.job.generation"] == 1 and gang["kumiki.pods"] == 2
    assert gang["kumiki.podgroup"] == "train" and gang["k8s.namespace.name"] == ns
    assert gang["kumiki.binder.trigger"] == "submit" and gang["kumiki.outcome"] == "bound"
    # -> Placement.Bind over gRPC (one unary call for this sampled gang, its own CLIENT span)
    client = tree.find("kumiki.v1.Placement/Bind", "kumiki-binder", root)
    server = tree.find("kumiki.v1.Placement/Bind", "kumiki-placement", client)
    assert (tree.spans[client]["kind"], tree.spans[server]["kind"]) == ("client", "server")
    for span in (client, server):
        tags = tree.tags(span)
        assert (tags["rpc.system"], tags["rpc.service"], tags["rpc.method"]) == ("grpc", "kumiki.v1.Placement", "Bind")
        assert tags["rpc.grpc.status_code"] == 0
    assert tree.tags(client)["server.port"] == stack.services["placement"].grpc_port
    # -> the scheduling pass: the decision's attributes
    schedule = tree.find("schedule", "kumiki-placement", server)
    decision = tree.tags(schedule)
    assert decision["kumiki.job.id"] == job_id and decision["kumiki.queue"] == "team-a"
    assert decision["kumiki.gpus"] == 4 and decision["kumiki.pods"] == 2
    assert decision["kumiki.outcome"] == "bound" and decision["kumiki.quota.admitted"] is True
    assert all(placed[f"train-{i}"] in str(decision["kumiki.nodes"]) for i in range(2)), decision
    # -> Quota.Admit, before the events go out
    admit_client = tree.find("kumiki.v1.Quota/Admit", "kumiki-placement", schedule)
    admit_server = tree.find("kumiki.v1.Quota/Admit", "kumiki-quota", admit_client)
    assert tree.tags(tree.find("admit", "kumiki-quota", admit_server))["kumiki.quota.outcome"] == "admitted"
    # -> the Kafka send -> every consumer's handling
    send = tree.find("send", "kumiki-placement", schedule)
    sent = tree.tags(send)
    assert tree.spans[send]["kind"] == "producer" and sent["messaging.system"] == "kafka"
    assert sent["messaging.destination.name"] == f"{prefix}job.lifecycle, {prefix}scheduling.decisions"
    assert tree.spans[admit_client]["start"] < tree.spans[send]["start"]
    for service in CONSUMERS:
        (consumed,) = spans_named(tree, f"process {prefix}job.lifecycle", service, send)
        tags = tree.tags(consumed)
        assert tree.spans[consumed]["kind"] == "consumer" and tags["messaging.operation.type"] == "process"
        assert tags["messaging.kafka.message.key"] == job_id
    # -> the Bindings in the API server: the binder's HTTP CLIENT spans, once Placement answered
    bindings = spans_named(tree, BINDING, "kumiki-binder", root)
    assert len(bindings) == 2, tree.describe()
    answered = tree.spans[client]["start"] + tree.spans[client]["duration"]
    by_pod = {}
    for binding in bindings:
        tags = tree.tags(binding)
        assert tree.spans[binding]["kind"] == "client" and tags["http.request.method"] == "POST"
        assert tags["http.response.status_code"] == 201 and tags["k8s.namespace.name"] == ns
        assert tags["url.full"].endswith(f"/api/v1/namespaces/{ns}/pods/{tags['k8s.pod.name']}/binding")
        assert tags["server.port"] == int(kube_stack.api_url.rsplit(":", 1)[1].rstrip("/"))
        assert tree.spans[binding]["start"] >= answered
        by_pod[tags["k8s.pod.name"]] = tags["k8s.node.name"]
    assert by_pod == {name: node for name, node in placed.items() if name.startswith("train-")}
    services = {span["service"] for span in tree.spans.values()}
    assert {"kumiki-binder", "kumiki-placement", *CONSUMERS} <= services, services

    # what an operator sees
    shown = kumiki("trace", job_id, "--jaeger", jaeger.query_url, "--since", "1h")
    assert shown.returncode == 0, shown.stderr
    assert "kumiki-binder  reconcile pod group" in shown.stdout and BINDING in shown.stdout, shown.stdout
    print(shown.stdout)  # docs/observability.md shows this output


async def test_a_gang_the_binders_sampler_leaves_out_leaves_nothing_downstream(
    kube: AsyncClient,
    kube_stack: KubeStack,
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    jaeger: JaegerProcess,
    tmp_path: Path,
) -> None:
    """The binder samples at ratio 0: its gangs go over the BindStream, whose unsampled trace context makes
    placement's parent-based sampler (the default) record nothing for them, and so nothing downstream either: a
    trace is kept or dropped whole where it starts. (Without that context placement would start a trace of
    its own for every gang.)"""
    await create_all(kube, [node_object("gpu-0", 8)])
    await wait_until(lambda: nodes_ready(kube, 1), timeout_s=60, interval_s=0.3, what="KWOK to make the node Ready")
    with live_stack(kafka, database_settings, tmp_path / "stack", tracing_env(jaeger), names=("placement",)) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement ready")
        binder = Processes(kube_stack, kafka, tmp_path)
        binder.placement_port = stack.services["placement"].grpc_port
        sampler = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
        try:
            await binder.start_binder(True, **tracing_env(jaeger), **sampler)
            ns = await namespace(kube)
            await create_all(kube, [pod_object(ns, f"solo-{i}", gpus=1) for i in range(3)])
            await wait_until(lambda: bound(kube, ns, "solo-", 3), timeout_s=60, interval_s=0.3, what="3 pods bound")
        finally:
            binder.stop()  # SIGTERM: the binder's batch processor is flushed
            print(binder.logs())
    # placement stopped too (flushed): what Jaeger has now is all there will be
    for i in range(3):
        assert find_traces(jaeger.query_url, f"{ns}/pod/solo-{i}", 600, 5) == []
    assert not find_traces_by_service(jaeger, "kumiki-binder", ns)


def find_traces_by_service(jaeger: JaegerProcess, service: str, ns: str) -> list[dict[str, Any]]:
    """The service's traces that name this namespace (none when the service never reported any span)."""
    from tests.observability.support import get_json

    try:
        body = get_json(f"{jaeger.query_url}/api/traces", {"service": service, "limit": "200", "lookback": "1h"})
    except OSError:
        return []
    return [
        data
        for data in body.get("data") or []
        if any(tag.get("value") == ns for span in data["spans"] for tag in span.get("tags", []))
    ]


def condition(pod: dict[str, Any]) -> dict[str, Any]:
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item.get("type") == "PodScheduled":
            return dict(item)
    return {}


async def told_unschedulable(kube: AsyncClient, ns: str, name: str) -> bool:
    pods = [pod for pod in await pods_in(kube, ns) if pod["metadata"]["name"] == name]
    return bool(pods) and not pods[0]["spec"].get("nodeName") and condition(pods[0]).get("status") == "False"


async def gone(kube: AsyncClient, ns: str, name: str) -> bool:
    return not any(pod["metadata"]["name"] == name for pod in await pods_in(kube, ns))


async def test_a_preemption_through_the_binder_is_one_trace_to_the_rebinds_binding(
    kube: AsyncClient,
    kube_stack: KubeStack,
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    jaeger: JaegerProcess,
    tmp_path: Path,
) -> None:
    """An urgent pod (a PriorityClass) finds both nodes full: the binder's span for it -> Placement.Bind ->
    schedule -> preempt (the victim) -> PREEMPT -> the coordinator's CHECKPOINT -> the job's Report (the SDK,
    in this process) -> EVICT -> the binder's `process` span for the command -> its eviction of the victim's
    pod (the Eviction API) and the coordinator's Placement.Release -> requeue; once the other job's pod is
    deleted, the pass rebinds the victim's next generation (its pod made again, as its job controller would)
    and the binder's Binding of that pod, from the BOUND event's context, is in the same trace."""
    await create_all(kube, [node_object(f"gpu-{index}", 8) for index in range(2)])
    await kube.create(PriorityClass(metadata=ObjectMeta(name="kumiki-urgent"), value=1))
    try:
        await wait_until(lambda: nodes_ready(kube, 2), timeout_s=60, interval_s=0.3, what="KWOK nodes Ready")
        await _preemption_through_the_binder(kube, kube_stack, kafka, database_settings, jaeger, tmp_path)
    finally:
        await kube.delete(PriorityClass, "kumiki-urgent")


async def _preemption_through_the_binder(
    kube: AsyncClient,
    kube_stack: KubeStack,
    kafka: KafkaSettings,
    database_settings: DatabaseSettings,
    jaeger: JaegerProcess,
    tmp_path: Path,
) -> None:
    prefix = kafka.topic_prefix
    env = {**stack_env(jaeger, deadline_s=120.0), "OTEL_BSP_SCHEDULE_DELAY": "100", "KUMIKI_PLACEMENT_CYCLE_S": "0.2"}
    with live_stack(kafka, database_settings, tmp_path / "stack", env, names=("placement", "preemption")) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement and preemption ready")
        binder = Processes(kube_stack, kafka, tmp_path)
        binder.placement_port = stack.services["placement"].grpc_port
        try:
            await binder.start_binder(True, **tracing_env(jaeger))
            ns = await namespace(kube)
            victim = f"{ns}/train"
            filler = pod_object(ns, "filler", gpus=8)
            await create_all(kube, [filler])
            await wait_until(lambda: bound(kube, ns, "filler", 1), timeout_s=60, interval_s=0.3, what="filler bound")
            train = pod_object(ns, "train-0", gpus=8, group="train", labels={core.PREEMPTIBLE_LABEL: "true"})
            await create_all(kube, [podgroup_object(ns, "train", 1), train])
            await wait_until(lambda: bound(kube, ns, "train-", 1), timeout_s=60, interval_s=0.3, what="victim bound")
            job = Job(victim, 1, stack.services["preemption"].grpc_address)  # the victim's training process
            try:
                urgent = pod_object(ns, "urgent", gpus=8)
                urgent["spec"]["priorityClassName"] = "kumiki-urgent"
                await create_all(kube, [urgent])
                await wait_until(job.should_checkpoint, timeout_s=30, what="CHECKPOINT over Watch")
                assert job.report_checkpoint(f"file://{tmp_path}/step-42.npz", 42)
                await wait_until(lambda: gone(kube, ns, "train-0"), timeout_s=60, what="the victim's pod evicted")
                await wait_until(lambda: bound(kube, ns, "urgent", 1), timeout_s=60, what="the urgent pod bound")
            finally:
                job.close()
            # its job controller makes the pod again: the binder sends it as the requeued next generation
            await create_all(kube, [train])
            await wait_until(lambda: told_unschedulable(kube, ns, "train-0"), timeout_s=60, what="train-0 told")
            await kube.delete(Pod, "filler", namespace=ns, grace_period=0)  # the other job ends
            await wait_until(lambda: bound(kube, ns, "train-", 1), timeout_s=60, interval_s=0.3, what="rebound")
            shutdown_tracing()  # the job's Report span goes to Jaeger now
            trace_id = await the_trace(jaeger, f"{ns}/pod/urgent", "preempt")

            def whole(tree: Tree) -> bool:  # the last spans of each process (the test's Report is flushed last)
                return (
                    bool(resumed(prefix)(tree))
                    and bool(spans_named(tree, BINDING, "kumiki-binder"))
                    and bool(spans_named(tree, "kumiki.v1.Checkpoints/Report", "kumiki-test"))
                )

            tree = await collected(jaeger, trace_id, whole, "the preemption's trace to the rebind's Binding")
        finally:
            binder.stop()
            print(binder.logs())
        placed = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in await pods_in(kube, ns)}

    print(tree.describe())
    checkpoint = decision_to_checkpoint(tree, prefix, victim, caller="kumiki-binder", beneficiary=f"{ns}/pod/urgent")
    report_client = tree.find("kumiki.v1.Checkpoints/Report", "kumiki-test", checkpoint)
    report_server = tree.find("kumiki.v1.Checkpoints/Report", "kumiki-preemption", report_client)
    evict = tree.find("evict command", "kumiki-preemption", report_server)
    (command,) = command_sends(tree, prefix, evict)
    # the binder handles the EVICT command: its consumer span, its eviction, the Eviction API's answer
    handled = tree.find(f"process {prefix}preemption.commands", "kumiki-binder", command)
    assert tree.tags(handled)["messaging.consumer.group.name"] == "kumiki-binder"
    evicting = tree.find("evict pod group", "kumiki-binder", handled)
    assert tree.tags(evicting)["kumiki.job.id"] == victim and tree.tags(evicting)["kumiki.evicted"] is True
    eviction = tree.find(EVICTION, "kumiki-binder", evicting)
    tags = tree.tags(eviction)
    assert tree.spans[eviction]["kind"] == "client" and tags["http.response.status_code"] == 201
    assert (tags["k8s.namespace.name"], tags["k8s.pod.name"]) == (ns, "train-0")
    # the coordinator's Release requeues, the pass rebinds the next generation
    requeue_and_rebind(tree, prefix, evict, victim)
    release_server = tree.find("kumiki.v1.Placement/Release", "kumiki-placement")
    rebind = tree.find("schedule", "kumiki-placement", release_server, **{"kumiki.job.id": victim})
    bound_event = tree.find("send", "kumiki-placement", rebind)
    # -> the binder binds the rebound pod, continuing the BOUND event's trace
    rebinding = tree.find("reconcile pod group", "kumiki-binder", bound_event)
    assert tree.tags(rebinding)["kumiki.binder.trigger"] == "cycle"
    assert tree.tags(rebinding)["kumiki.job.generation"] == 2
    binding = tree.find(BINDING, "kumiki-binder", rebinding)
    assert tree.tags(binding)["k8s.pod.name"] == "train-0"
    assert tree.tags(binding)["k8s.node.name"] == placed["train-0"]
    services = {span["service"] for span in tree.spans.values()}
    assert {"kumiki-binder", "kumiki-placement", "kumiki-preemption", "kumiki-test"} <= services, services
    shown = kumiki("trace", victim, "--jaeger", jaeger.query_url, "--since", "1h")
    assert f"trace {trace_id:032x}" in shown.stdout, shown.stdout + shown.stderr
    print(shown.stdout)  # docs/observability.md shows this output
