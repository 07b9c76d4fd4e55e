"""A preemption is one trace in a real Jaeger: the beneficiary's decision in placement, the victim's PREEMPT
event, the coordinator's CHECKPOINT command (from its Postgres outbox), the job's Report through the SDK, the
EVICT command and Placement.Release, the requeue, the rebind of the next generation and its RESUME command.

Placement and the preemption coordinator run as processes over Apache Kafka and Postgres; the test process is
the caller (a binder's span) and the job (the SDK). The second test SIGKILLs the coordinator after it issued
CHECKPOINT: the restarted process evicts at the deadline, and its steps are still children of the decision's
trace, from the traceparent stored with the protocol."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.tracing import shutdown_tracing
from kumiki.devstack.cluster import emulated_nodes
from kumiki.devstack.observability import JaegerProcess
from kumiki.sdk import Job
from tests.conftest import wait_until
from tests.observability.support import Tree, collected, live_stack
from tests.observability.test_jaeger import decide, traced_channel
from tests.observability.test_trace_cli import kumiki
from tests.placement.support import emulate
from tests.preemption.support import H100, train_request

VICTIM = "team/train"
BOUND = placement_pb2.BindResponse.OUTCOME_BOUND
PENDING = placement_pb2.BindResponse.OUTCOME_PENDING


def stack_env(jaeger: JaegerProcess, deadline_s: float) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp_endpoint,
        "KUMIKI_PLACEMENT_POLICY": "kumiki",
        "KUMIKI_PLACEMENT_MIN_RUN_S": "0",
        "KUMIKI_PREEMPTION_DEADLINE_S": str(deadline_s),
    }


async def two_jobs_and_a_preemption(stub: placement_pb2_grpc.PlacementStub, victim: str) -> int:
    """A filler (not preemptible) and the victim fill two 8-GPU nodes; an urgent 8-GPU job can only have the
    victim's node, so its Bind names the victim. Returns the urgent Bind's trace id."""
    filler = await stub.Bind(train_request("team/filler", 1, gpus=8))
    train = await stub.Bind(train_request(victim, 1, preemptible=True))
    assert (filler.outcome, train.outcome) == (BOUND, BOUND)
    assert filler.assignments[0].node != train.assignments[0].node
    trace_id, urgent = await decide(stub, train_request("team/urgent", 1, gpus=8, priority_tier=1))
    assert urgent.outcome == PENDING and "preempted" in urgent.reasons[0].message, urgent.reasons
    return trace_id


async def end_filler(stub: placement_pb2_grpc.PlacementStub) -> None:
    """The filler ends: the victim's next generation (requeued, waiting) is bound by the scheduling pass."""
    await stub.Release(
        placement_pb2.ReleaseRequest(
            job=common_pb2.JobRef(job_id="team/filler", generation=1), final_state=events_pb2.JOB_STATE_COMPLETED
        )
    )


def command_sends(tree: Tree, prefix: str, parent: str) -> list[str]:
    name = f"send {prefix}preemption.commands"
    return [i for i, s in tree.spans.items() if s["name"] == name and s["parent"] == parent]


def requeue_and_rebind(tree: Tree, prefix: str, evict: str, victim: str) -> None:
    """evict command -> Placement.Release CLIENT (coordinator) -> SERVER (placement) -> the requeue's send, and
    -> the rebind's schedule -> its send -> the coordinator's lifecycle consumer -> resume command -> its send."""
    release_client = tree.find("kumiki.v1.Placement/Release", "kumiki-preemption", evict)
    tags = tree.tags(release_client)
    assert tree.spans[release_client]["kind"] == "client"
    assert (tags["rpc.system"], tags["rpc.service"], tags["rpc.method"]) == ("grpc", "kumiki.v1.Placement", "Release")
    assert tags["rpc.grpc.status_code"] == 0
    release_server = tree.find("kumiki.v1.Placement/Release", "kumiki-placement", release_client)
    assert tree.spans[release_server]["kind"] == "server"
    requeue = tree.find("send", "kumiki-placement", release_server)
    assert f"{prefix}job.lifecycle" in tree.tags(requeue)["messaging.destination.name"]
    rebind = tree.find("schedule", "kumiki-placement", release_server)
    decision = tree.tags(rebind)
    assert decision["kumiki.job.id"] == victim and decision["kumiki.job.generation"] == 2
    assert decision["kumiki.outcome"] == "bound" and decision["kumiki.requeued"] is True
    bound = tree.find("send", "kumiki-placement", rebind)
    consumed = tree.find(f"process {prefix}job.lifecycle", "kumiki-preemption", bound)
    assert tree.spans[consumed]["kind"] == "consumer"
    resume = tree.find("resume command", "kumiki-preemption", consumed)
    assert tree.tags(resume)["kumiki.job.generation"] == 2
    assert len(command_sends(tree, prefix, resume)) == 1


def decision_to_checkpoint(
    tree: Tree, prefix: str, victim: str, caller: str = "kumiki-test", beneficiary: str = "team/urgent"
) -> str:
    """caller -> Bind -> schedule (the beneficiary) -> preempt (the victim) -> send PREEMPT -> the coordinator's
    process span -> checkpoint command -> its send; returns the checkpoint command's span. `caller`: the
    service whose `reconcile pod group` span is the root (the binder's, or this test's standing in for it)."""
    (root,) = [i for i, s in tree.spans.items() if s["name"] == "reconcile pod group" and s["parent"] is None]
    assert tree.spans[root]["service"] == caller
    client = tree.find("kumiki.v1.Placement/Bind", caller, root)
    server = tree.find("kumiki.v1.Placement/Bind", "kumiki-placement", client)
    schedule = tree.find("schedule", "kumiki-placement", server)
    assert tree.tags(schedule)["kumiki.job.id"] == beneficiary
    assert tree.tags(schedule)["kumiki.outcome"] == "pending"
    preempt = tree.find("preempt", "kumiki-placement", schedule)
    chosen = tree.tags(preempt)
    assert chosen["kumiki.job.id"] == victim and chosen["kumiki.preemption.beneficiary"] == beneficiary
    assert chosen["kumiki.preemption.reason"] == "priority"
    send = tree.find(f"send {prefix}scheduling.decisions", "kumiki-placement", preempt)
    assert tree.spans[send]["kind"] == "producer" and tree.tags(send)["messaging.system"] == "kafka"
    consumed = tree.find(f"process {prefix}scheduling.decisions", "kumiki-preemption", send)
    tags = tree.tags(consumed)
    assert tree.spans[consumed]["kind"] == "consumer" and tags["messaging.operation.type"] == "process"
    assert "preemption" in tags["messaging.consumer.group.name"] and tags["messaging.kafka.message.key"] == victim
    checkpoint = tree.find("checkpoint command", "kumiki-preemption", consumed)
    assert tree.tags(checkpoint)["kumiki.preemption.action"] == "checkpoint"
    assert tree.tags(checkpoint)["kumiki.preemption.command_id"] == f"{victim}/1/checkpoint"
    (published,) = command_sends(tree, prefix, checkpoint)
    assert tree.spans[published]["kind"] == "producer"
    assert tree.tags(published)["messaging.message.id"] == f"{victim}/1/checkpoint"
    return checkpoint


def has(name: str, service: str) -> Any:
    return lambda tree: any(s["name"] == name and s["service"] == service for s in tree.spans.values())


def resumed(prefix: str) -> Any:
    """The RESUME command's span and its send are in Jaeger (they arrive in different export batches)."""
    return lambda tree: any(
        span["name"] == "resume command" and command_sends(tree, prefix, span_id)
        for span_id, span in tree.spans.items()
    )


async def test_preemption_is_one_trace_in_jaeger_from_the_decision_to_the_resume(
    kafka: KafkaSettings, database_settings: DatabaseSettings, jaeger: JaegerProcess, tmp_path: Path
) -> None:
    await emulate(kafka, emulated_nodes(2, shapes=(H100,)))
    prefix = kafka.topic_prefix
    env = stack_env(jaeger, deadline_s=120.0)
    with live_stack(kafka, database_settings, tmp_path, env, names=("placement", "preemption")) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement and preemption ready")
        job = Job(VICTIM, 1, stack.services["preemption"].grpc_address)  # the training process, in this one
        try:
            channel = traced_channel(stack.services["placement"].grpc_address)
            stub = placement_pb2_grpc.PlacementStub(channel)
            trace_id = await two_jobs_and_a_preemption(stub, VICTIM)
            await wait_until(job.should_checkpoint, timeout_s=30, what="CHECKPOINT over Watch")
            assert job.commands[0].traceparent, "the command carries its step's trace context"
            assert await asyncio.to_thread(job.report_checkpoint, f"file://{tmp_path}/step-42.npz", 42)
            assert job.should_stop()
            await wait_until(lambda: job.commands[-1].action == events_pb2.PREEMPTION_ACTION_EVICT, timeout_s=30)
            await end_filler(stub)
            await channel.close()
        finally:
            job.close()
        shutdown_tracing()  # the job's Report span goes to Jaeger now
        # the job's Report is flushed last, from this process: wait for it as well as for RESUME
        reported = has("kumiki.v1.Checkpoints/Report", "kumiki-test")
        tree = await collected(
            jaeger, trace_id, lambda t: resumed(prefix)(t) and reported(t), "the preemption's trace up to RESUME"
        )

    checkpoint = decision_to_checkpoint(tree, prefix, VICTIM)
    # the job answers the command it was sent: its Report continues the command's step
    report_client = tree.find("kumiki.v1.Checkpoints/Report", "kumiki-test", checkpoint)
    assert tree.spans[report_client]["kind"] == "client"
    assert tree.tags(report_client)["rpc.service"] == "kumiki.v1.Checkpoints"
    report_server = tree.find("kumiki.v1.Checkpoints/Report", "kumiki-preemption", report_client)
    assert tree.tags(report_server)["rpc.grpc.status_code"] == 0
    evict = tree.find("evict command", "kumiki-preemption", report_server)
    assert tree.tags(evict)["kumiki.preemption.forced"] is False
    assert len(command_sends(tree, prefix, evict)) == 1
    requeue_and_rebind(tree, prefix, evict, VICTIM)
    services = {span["service"] for span in tree.spans.values()}
    assert services == {"kumiki-test", "kumiki-placement", "kumiki-preemption"}, services
    ordered = [tree.spans[s]["start"] for s in (checkpoint, report_client, report_server, evict)]
    assert ordered == sorted(ordered)

    # what an operator sees: `kumiki trace VICTIM` finds the preemption by the victim's own decision spans
    shown = kumiki("trace", VICTIM, "--jaeger", jaeger.query_url, "--since", "1h")
    assert shown.returncode == 0, shown.stderr
    preemption = next(block for block in shown.stdout.split("\n\n") if f"trace {trace_id:032x}" in block)
    header = preemption.splitlines()[0]
    assert "preempted for team/urgent (priority), evicted, attempt 2 bound on node-" in header, header
    for line in ("checkpoint command", "kumiki-test  kumiki.v1.Checkpoints/Report [client]", "resume command"):
        assert line in preemption, line
    print(shown.stdout)  # docs/observability.md shows this output
    print(kumiki("trace", "team/filler", "--jaeger", jaeger.query_url, "--since", "1h").stdout)


async def test_after_a_coordinator_restart_the_forced_eviction_is_in_the_decisions_trace(
    kafka: KafkaSettings, database_settings: DatabaseSettings, jaeger: JaegerProcess, tmp_path: Path
) -> None:
    """The coordinator is SIGKILLed once CHECKPOINT is out; the job never answers. The restarted process evicts
    at the deadline from what Postgres holds, and the eviction, release, requeue, rebind and RESUME are
    children of the CHECKPOINT step through the traceparent stored with the protocol."""
    await emulate(kafka, emulated_nodes(2, shapes=(H100,)))
    prefix = kafka.topic_prefix
    victim = "team/train-restarted"
    deadline_s = 6.0
    env = stack_env(jaeger, deadline_s)
    with live_stack(kafka, database_settings, tmp_path, env, names=("placement", "preemption")) as stack:
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="placement and preemption ready")
        channel = traced_channel(stack.services["placement"].grpc_address)
        stub = placement_pb2_grpc.PlacementStub(channel)
        trace_id = await two_jobs_and_a_preemption(stub, victim)
        sent = f"send {prefix}preemption.commands"
        before = await collected(jaeger, trace_id, has(sent, "kumiki-preemption"), "CHECKPOINT sent before the kill")
        assert not before.has("evict command", "kumiki-preemption"), "the deadline must not have passed yet"
        stack.kill_and_restart("preemption")
        await wait_until(stack.ready, timeout_s=120, interval_s=0.3, what="the restarted coordinator ready")
        tree = await collected(
            jaeger, trace_id, has("evict command", "kumiki-preemption"), "the restarted coordinator's eviction"
        )
        await end_filler(stub)
        await channel.close()
        tree = await collected(jaeger, trace_id, resumed(prefix), "the preemption's trace up to RESUME")

    checkpoint = decision_to_checkpoint(tree, prefix, victim)
    evict = tree.find("evict command", "kumiki-preemption", checkpoint)  # no Report: the deadline's own step
    assert tree.tags(evict)["kumiki.preemption.forced"] is True
    assert tree.spans[evict]["start"] - tree.spans[checkpoint]["start"] >= deadline_s * 1e6
    assert len(command_sends(tree, prefix, evict)) == 1
    requeue_and_rebind(tree, prefix, evict, victim)
    assert not any(s["name"] == "kumiki.v1.Checkpoints/Report" for s in tree.spans.values())
    shown = kumiki("trace", victim, "--jaeger", jaeger.query_url, "--since", "1h")
    assert f"trace {trace_id:032x}" in shown.stdout, shown.stdout + shown.stderr
    assert "evicted at the deadline, attempt 2 bound on" in shown.stdout
