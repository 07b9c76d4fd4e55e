"""The binder against a real kube-apiserver v1.37.2 (etcd v3.7.0) with KWOK nodes of 8 GPUs each, placement
and the binder as processes on Apache Kafka: pods, gangs, MIG and fractions bound without over-commit, gangs
whole or not at all, reasons on pending pods, cordons, phases to job.lifecycle, evictions, SIGKILL."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import grpc
import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from kumiki.binder import core
from kumiki.common.bus import EventProducer
from kumiki.common.bus.replay import TopicReader
from kumiki.common.bus.topics import JOB_LIFECYCLE, PREEMPTION_COMMANDS
from kumiki.common.config import KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from tests.binder.support import (
    PodGroup,
    Processes,
    create_all,
    namespace,
    node_object,
    over_commits,
    pod_object,
    podgroup_object,
    pods_in,
)
from tests.conftest import metric_samples, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


async def until(predicate: Any, timeout_s: float, what: str) -> Any:
    """wait_until at a pace the API server can take while it schedules (listing hundreds of pods)."""
    return await wait_until(predicate, timeout_s=timeout_s, interval_s=0.3, what=what)


def condition(pod: dict[str, Any], kind: str = "PodScheduled") -> dict[str, Any] | None:
    for item in (pod.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return item  # type: ignore[no-any-return]
    return None


def bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [pod for pod in pods if (pod.get("spec") or {}).get("nodeName")]


async def all_bound(client: AsyncClient, ns: str, count: int) -> bool:
    pods = await pods_in(client, ns)
    return len(pods) == count and len(bound(pods)) == count


async def until_or_say(
    client: AsyncClient, ns: str, predicate: Any, timeout_s: float, what: str, more: Any = ""
) -> None:
    """`until`, and on a timeout what each pod of the namespace got (its node and PodScheduled condition)."""
    try:
        await until(predicate, timeout_s=timeout_s, what=what)
    except AssertionError as error:
        pods = await pods_in(client, ns)
        states = {item["metadata"]["name"]: (item["spec"].get("nodeName"), condition(item)) for item in pods}
        raise AssertionError(f"{error}: {states} {more() if callable(more) else more}") from None


async def lifecycle(kafka: KafkaSettings) -> list[events_pb2.JobLifecycle]:
    out: list[events_pb2.JobLifecycle] = []

    async def keep(key: str, event: Any) -> None:
        if event is not None:
            out.append(event.payload)

    reader = TopicReader(kafka, JOB_LIFECYCLE, keep)
    await reader.start()
    try:
        await reader.catch_up()
    finally:
        await reader.stop()
    return out


async def told(client: AsyncClient, ns: str, names: list[str]) -> bool:
    """Each named pod is unbound and says why (PodScheduled=False)."""
    pods = {item["metadata"]["name"]: item for item in await pods_in(client, ns)}
    return all(name in pods and (condition(pods[name]) or {}).get("status") == "False" for name in names)


async def start(processes: Processes, client: AsyncClient, nodes: list[dict[str, Any]], **binder_env: str) -> None:
    await create_all(client, nodes)

    async def ready() -> bool:
        listed = [node.to_dict() async for node in client.list(Node)]
        return len(listed) == len(nodes) and all(core.parse_node(node).schedulable for node in listed)

    await until(ready, timeout_s=60, what="KWOK to make every node Ready")
    await processes.start_placement()
    await processes.start_binder(**binder_env)


async def test_a_hundred_pods_with_gangs_mig_and_fractions_bind_without_over_commit(
    kube: AsyncClient, processes: Processes
) -> None:
    # room for everything at once (89 whole GPUs asked of 128 + 24 shareable): the queue policy never holds a
    # gang back for the 2x8-GPU one here, so every pod must be bound
    nodes = [node_object(f"gpu-{index:02d}", 8, rack=f"rack-{index // 6}") for index in range(16)]
    nodes += [node_object(f"mig-{index}", 8, mig=True) for index in range(3)]
    nodes += [node_object(f"share-{index}", 8, shareable=True) for index in range(4)]
    await start(processes, kube, nodes)
    ns = await namespace(kube)
    # the binder submits these in no set order: whole GPUs must keep off the shareable nodes while dedicated
    # cards are free, or later fractions find those nodes filled
    rng = random.Random(12)
    objects: list[dict[str, Any]] = [
        pod_object(ns, f"share-{i:02d}", fraction=rng.choice([0.25, 0.5]), gpu_memory="16Gi") for i in range(20)
    ]
    gangs: dict[str, int] = {}
    for size in (2, 4, 8, 16):
        group = f"gang-{size}"
        gangs[group] = size
        objects.append(podgroup_object(ns, group, size))
        objects += [pod_object(ns, f"{group}-{i:02d}", gpus=1, group=group) for i in range(size)]
    objects.append(podgroup_object(ns, "wide", 2))
    gangs["wide"] = 2
    objects += [pod_object(ns, f"wide-{i}", gpus=8, group="wide") for i in range(2)]
    gangs["labelled"] = 3  # a gang by label only, no PodGroup object
    objects += [pod_object(ns, f"labelled-{i}", gpus=2, group="labelled") for i in range(3)]
    objects += [pod_object(ns, f"mig-{i:02d}", mig="1g.10gb") for i in range(20)]
    objects += [pod_object(ns, f"solo-{i:02d}", gpus=rng.choice([1, 2])) for i in range(25)]
    pod_count = sum(1 for obj in objects if obj["kind"] == "Pod")
    assert pod_count == 100
    await create_all(kube, objects)

    try:
        await until(lambda: all_bound(kube, ns, 100), timeout_s=180, what="all 100 pods bound")
    except AssertionError:
        waiting = [
            (p["metadata"]["name"], condition(p)) for p in await pods_in(kube, ns) if not p["spec"].get("nodeName")
        ]
        raise AssertionError(f"unbound after 180 s: {waiting}") from None
    pods = await pods_in(kube, ns)
    assert over_commits(pods) == []
    by_name = {pod["metadata"]["name"]: pod for pod in pods}
    for group, size in gangs.items():
        members = [pod for pod in pods if pod["metadata"].get("labels", {}).get(core.POD_GROUP_LABEL) == group]
        assert len(members) == size and all(pod["spec"]["nodeName"] for pod in members)
        assert {pod["metadata"]["annotations"][core.GENERATION_ANNOTATION] for pod in members} == {"1"}
    for name, pod in by_name.items():
        node, annotations = pod["spec"]["nodeName"], pod["metadata"]["annotations"]
        if name.startswith("mig-"):
            assert node.startswith("mig-") and annotations[core.MIG_SLICE_ANNOTATION].startswith("1g.10gb@")
        elif name.startswith("share-"):
            assert node.startswith("share-") and float(annotations[core.GPU_FRACTION_ANNOTATION]) in (0.25, 0.5)
        else:
            indices = annotations[core.GPU_INDICES_ANNOTATION].split(",")
            assert annotations[core.GPU_UUIDS_ANNOTATION].split(",") == [f"GPU-{node}-{index}" for index in indices]
    # KWOK runs them: the phases the binder follows
    await until(lambda: _all_phase(kube, ns, "Running", 100), timeout_s=60, what="KWOK to run every bound pod")
    await until(
        lambda: _running_jobs(processes.kafka, f"{ns}/gang-16"), timeout_s=30, what="RUNNING for the 16-pod gang"
    )


async def _all_phase(client: AsyncClient, ns: str, phase: str, count: int) -> bool:
    pods = await pods_in(client, ns)
    return sum(1 for pod in pods if (pod.get("status") or {}).get("phase") == phase) >= count


async def _running_jobs(kafka: KafkaSettings, job_id: str) -> bool:
    return any(
        record.job.job_id == job_id and record.state == events_pb2.JOB_STATE_RUNNING
        for record in await lifecycle(kafka)
    )


async def test_gangs_that_do_not_fit_wait_whole_with_the_reason_and_volcano_3373(
    kube: AsyncClient, processes: Processes
) -> None:
    await start(processes, kube, [node_object(f"gpu-{index}", 8) for index in range(2)])
    ns = await namespace(kube)
    # volcano-sh/volcano#3373: two gangs that each fit alone, not together, arrive at once
    objects: list[dict[str, Any]] = []
    for group in ("left", "right"):
        objects.append(podgroup_object(ns, group, 2))
        objects += [pod_object(ns, f"{group}-{i}", gpus=8, group=group) for i in range(2)]
    await create_all(kube, objects)

    async def one_gang_bound_one_told() -> bool:
        pods = await pods_in(kube, ns)
        waiting = [pod for pod in pods if not pod["spec"].get("nodeName")]
        told = [pod for pod in waiting if (condition(pod) or {}).get("status") == "False"]
        return len(bound(pods)) == 2 and len(told) == 2

    await until(one_gang_bound_one_told, timeout_s=60, what="one gang bound and the other pending with a reason")
    pods = await pods_in(kube, ns)
    groups = {pod["metadata"]["labels"][core.POD_GROUP_LABEL] for pod in bound(pods)}
    assert len(groups) == 1, f"a gang was split: {groups}"
    waiting_group = ({"left", "right"} - groups).pop()
    for pod in pods:
        if pod["metadata"]["labels"][core.POD_GROUP_LABEL] == waiting_group:
            assert not pod["spec"].get("nodeName")
            told = condition(pod) or {}
            assert told.get("reason") == "Unschedulable" and "GPU" in told.get("message", ""), told

    # a gang larger than the cluster at once: every pod pending, none bound, the condition says why
    ns2 = await namespace(kube)
    await create_all(
        kube, [podgroup_object(ns2, "huge", 3), *(pod_object(ns2, f"huge-{i}", gpus=8, group="huge") for i in range(3))]
    )
    # a pod no node could ever hold is told so
    await create_all(kube, [pod_object(ns2, "sixteen", gpus=16)])

    async def all_told() -> bool:
        pods = await pods_in(kube, ns2)
        return len(pods) == 4 and all((condition(pod) or {}).get("status") == "False" for pod in pods)

    await until(all_told, timeout_s=60, what="every pod of the unfit gang and the never-fitting pod told why")
    pods = {pod["metadata"]["name"]: pod for pod in await pods_in(kube, ns2)}
    assert not bound(list(pods.values()))
    never = condition(pods["sixteen"]) or {}
    assert never["reason"] == "NeverFits" and "largest node has 8" in never["message"]
    for i in range(3):
        told = condition(pods[f"huge-{i}"]) or {}
        assert told["reason"] == "Unschedulable" and "GPU" in told["message"], told

    async def told_in_events_and_phase() -> bool:  # Events go out from a queue, the phase after the pods
        events = [event async for event in kube.list(Event, namespace=ns2)]
        group = await kube.get(PodGroup, "huge", namespace=ns2)
        return (
            any(event.reason == "FailedScheduling" and event.involvedObject.name == "sixteen" for event in events)
            and any(event.involvedObject.kind == "PodGroup" and event.involvedObject.name == "huge" for event in events)
            and (group.status or {}).get("phase") == "Pending"
        )

    await until(told_in_events_and_phase, timeout_s=30, what="Events on the pod and the PodGroup, phase Pending")

    # when the bound gang ends, the waiting one of #3373 gets the GPUs
    for pod in bound(await pods_in(kube, ns)):
        await kube.delete(Pod, pod["metadata"]["name"], namespace=ns, grace_period=0)
    await until(lambda: all_bound(kube, ns, 2), timeout_s=60, what="the waiting gang bound once the other left")


async def test_a_waiting_gangs_pods_say_what_blocks_it_now_though_they_do_not_change(
    kube: AsyncClient, processes: Processes
) -> None:
    """A gang queued in Placement: what blocks it changes when another job ends, though its own pods do not. The
    binder asks Placement again (Explain, every KUMIKI_BINDER_REASON_REFRESH_S) and the pods say the new reason."""
    nodes = [node_object(f"gpu-{index}", 8) for index in range(2)]
    await create_all(kube, nodes)

    async def nodes_ready() -> bool:
        listed = [node.to_dict() async for node in kube.list(Node)]
        return len(listed) == 2 and all(core.parse_node(node).schedulable for node in listed)

    await until(nodes_ready, timeout_s=60, what="KWOK to make both nodes Ready")
    await processes.start_placement()
    await processes.start_binder(KUMIKI_BINDER_REASON_REFRESH_S="1")
    ns = await namespace(kube)
    await create_all(kube, [pod_object(ns, "first", gpus=8), pod_object(ns, "second", gpus=8)])
    await until(lambda: all_bound(kube, ns, 2), timeout_s=60, what="two whole-node pods bound")
    await create_all(kube, [podgroup_object(ns, "pair", 2), *(pod_object(ns, f"pair-{i}", gpus=8, group="pair")
                                                              for i in range(2))])  # fmt: skip

    async def messages() -> set[str]:
        pods = [pod for pod in await pods_in(kube, ns) if pod["metadata"]["name"].startswith("pair-")]
        return {(condition(pod) or {}).get("message", "") for pod in pods if not pod["spec"].get("nodeName")}

    async def told(text: str) -> bool:
        now = await messages()
        return len(now) == 1 and text in now.pop()

    await until(lambda: told("(most free on one node: 0)"), timeout_s=60, what="the pair told no node is free")
    await kube.delete(Pod, "first", namespace=ns, grace_period=0)  # gpu-0 frees; the pair still needs both
    await until(lambda: told("only 1 of 2 pods fit at once"), timeout_s=60, what="the pair told 1 of 2 fit now")
    assert not bound([pod for pod in await pods_in(kube, ns) if pod["metadata"]["name"].startswith("pair-")])

    async def told_in_an_event() -> bool:
        events = [event async for event in kube.list(Event, namespace=ns)]
        return any(
            event.reason == "FailedScheduling" and "only 1 of 2 pods fit" in (event.message or "") for event in events
        )

    await until(told_in_an_event, timeout_s=30, what="a FailedScheduling Event with the new reason")


async def test_a_node_cordoned_mid_stream_gets_no_new_pod(kube: AsyncClient, processes: Processes) -> None:
    await start(processes, kube, [node_object(f"gpu-{index}", 8) for index in range(4)])
    ns = await namespace(kube)
    await create_all(kube, [pod_object(ns, f"early-{i:02d}", gpus=1) for i in range(10)])
    await kube.patch(Node, "gpu-0", {"spec": {"unschedulable": True}})
    later = [pod_object(ns, f"late-{i:02d}", gpus=1) for i in range(14)]
    await create_all(kube, later)
    await until(lambda: all_bound(kube, ns, 24), timeout_s=60, what="all 24 pods bound")
    pods = await pods_in(kube, ns)
    on_cordoned = [
        pod["metadata"]["name"]
        for pod in pods
        if pod["metadata"]["name"].startswith("late") and pod["spec"]["nodeName"] == "gpu-0"
    ]
    assert on_cordoned == []
    assert over_commits(pods) == []


async def test_phases_become_lifecycle_events_and_releases(kube: AsyncClient, processes: Processes) -> None:
    await start(processes, kube, [node_object(f"gpu-{index}", 8) for index in range(2)])
    ns = await namespace(kube)
    await create_all(
        kube,
        [
            podgroup_object(ns, "train", 2),
            *(pod_object(ns, f"train-{i}", gpus=4, group="train", run_for="2s") for i in range(2)),
            pod_object(ns, "crash", gpus=1, run_for="1s", exit_code=3),
        ],
    )

    async def ended() -> list[events_pb2.JobLifecycle]:
        records = await lifecycle(processes.kafka)
        finals = [r for r in records if r.state in (events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED)]
        return finals if len(finals) >= 2 else []

    finals = await until(ended, timeout_s=60, what="COMPLETED and FAILED on job.lifecycle")
    by_job = {record.job.job_id: record for record in finals}
    assert by_job[f"{ns}/train"].state == events_pb2.JOB_STATE_COMPLETED
    assert by_job[f"{ns}/train"].runtime_s >= 1.5
    assert by_job[f"{ns}/pod/crash"].state == events_pb2.JOB_STATE_FAILED
    records = await lifecycle(processes.kafka)
    assert any(r.job.job_id == f"{ns}/train" and r.state == events_pb2.JOB_STATE_RUNNING for r in records)

    async def group_succeeded() -> bool:
        group = await kube.get(PodGroup, "train", namespace=ns)
        return (group.status or {}).get("phase") == "Succeeded"  # type: ignore[union-attr]

    await until(group_succeeded, timeout_s=30, what="the PodGroup's phase Succeeded")
    # released in placement: the GPUs are free again for a full-node gang
    await create_all(
        kube,
        [podgroup_object(ns, "after", 2), *(pod_object(ns, f"after-{i}", gpus=8, group="after") for i in range(2))],
    )
    await until(
        lambda: _bound_names(kube, ns, "after-"), timeout_s=60, what="the GPUs freed by the ended jobs to be used again"
    )


async def _bound_names(client: AsyncClient, ns: str, prefix: str) -> bool:
    pods = [pod for pod in await pods_in(client, ns) if pod["metadata"]["name"].startswith(prefix)]
    return bool(pods) and all(pod["spec"].get("nodeName") for pod in pods)


async def send_evict(processes: Processes, job_id: str, generation: int, command_id: str) -> None:
    """An EVICT on kumiki.preemption.commands, as the preemption coordinator sends it."""
    producer = EventProducer(processes.kafka, "//kumiki/preemption/test")
    await producer.start()
    try:
        command = events_pb2.PreemptionCommand(
            command_id=command_id,
            job=common_pb2.JobRef(job_id=job_id, generation=generation),
            action=events_pb2.PREEMPTION_ACTION_EVICT,
            reason="reclaim for team-b",
        )
        await producer.publish(PREEMPTION_COMMANDS, job_id, command, event_id=command_id)
    finally:
        await producer.stop()


async def test_evict_command_uses_the_eviction_api_and_respects_a_budget(
    kube: AsyncClient, processes: Processes
) -> None:
    await start(processes, kube, [node_object("gpu-0", 8)])
    ns = await namespace(kube)
    await create_all(
        kube,
        [
            podgroup_object(ns, "victim", 2),
            *(pod_object(ns, f"victim-{i}", gpus=2, group="victim", labels={"app": "victim"}) for i in range(2)),
        ],
    )
    await until(lambda: all_bound(kube, ns, 2), timeout_s=60, what="the victim gang bound")
    # a budget with nothing allowed (no disruption controller runs: status.disruptionsAllowed stays 0)
    await kube.create(
        PodDisruptionBudget.from_dict(
            {
                "metadata": {"name": "keep", "namespace": ns},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "victim"}}},
            }
        )
    )
    await send_evict(processes, f"{ns}/victim", 1, "c-1")

    async def refused_and_reported() -> bool:
        events = [event async for event in kube.list(Event, namespace=ns)]
        return any(event.reason == "EvictionRefused" for event in events)

    await until(refused_and_reported, timeout_s=60, what="a refused eviction reported on the pod")
    assert len(await pods_in(kube, ns)) == 2  # never deleted behind the budget's back
    await kube.delete(PodDisruptionBudget, "keep", namespace=ns)

    async def evicted() -> bool:
        return not await pods_in(kube, ns)

    await until(evicted, timeout_s=90, what="the pods evicted once the budget allows it")


def binder_metrics(processes: Processes, *prefixes: str) -> dict[str, float]:
    """The first binder's samples whose names start with one of `prefixes` (histograms: count, sum, +Inf)."""
    return {
        sample.name: sample.value
        for sample in metric_samples(processes.binder_http[0])
        if sample.name.startswith(prefixes) and sample.labels.get("le", "") in ("", "+Inf")
    }


async def test_an_evict_command_read_after_its_release_still_lets_the_next_generation_run(
    kube: AsyncClient, processes: Processes
) -> None:
    """The coordinator publishes EVICT (preemption.commands) and then releases the generation as PREEMPTED
    (job.lifecycle): two topics, so the binder may read them in either order. Read release first, the command
    must still evict that generation's pods and must not hold back the next generation's progress (it once did:
    the next generation's pods ran and succeeded, and the job never ended)."""
    ns, job = await bound_victim(kube, processes, gpus_each=2)
    await release_preempted(processes, job)
    confirmed = "kumiki_binder_evictions_confirmed_total"
    await until(lambda: binder_metrics(processes, confirmed).get(confirmed) == 1, 30, "the binder to read the release")
    await send_evict(processes, job, 1, "c-late")
    await until(lambda: no_pods(kube, ns), timeout_s=60, what="the first generation's pods evicted on the late command")
    assert awaiting_release(processes) == 0  # released already: nothing to wait for
    # the job's controller makes the next generation's pods (resuming from the checkpoint)
    await create_all(kube, next_generation(ns, gpus_each=2))
    states = await until(lambda: ended_states(processes, job, 2), timeout_s=60, what="the second generation COMPLETED")
    assert {events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING} <= states


async def bound_victim(kube: AsyncClient, processes: Processes, gpus_each: int) -> tuple[str, str]:
    """One 8-GPU node and a gang `victim` of two pods bound on it: (its namespace, its job id)."""
    await start(processes, kube, [node_object("gpu-0", 8)])
    ns = await namespace(kube)
    pods = [pod_object(ns, f"victim-{i}", gpus=gpus_each, group="victim") for i in range(2)]
    await create_all(kube, [podgroup_object(ns, "victim", 2), *pods])
    await until(lambda: all_bound(kube, ns, 2), timeout_s=60, what="the victim gang bound")
    return ns, f"{ns}/victim"


def next_generation(ns: str, gpus_each: int) -> list[dict[str, Any]]:
    """The pods the victim's job controller makes again (resuming from its checkpoint); they run a second."""
    return [pod_object(ns, f"victim-g2-{i}", gpus=gpus_each, group="victim", run_for="1s") for i in range(2)]


async def release_preempted(processes: Processes, job: str) -> None:
    """The coordinator's release of the job's first generation as PREEMPTED, as it sends it to Placement."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{processes.placement_port}") as channel:
        await placement_pb2_grpc.PlacementStub(channel).Release(
            placement_pb2.ReleaseRequest(
                job=common_pb2.JobRef(job_id=job, generation=1),
                reason="preempted",
                final_state=events_pb2.JOB_STATE_PREEMPTED,
            ),
            timeout=10.0,
        )


async def no_pods(kube: AsyncClient, ns: str) -> bool:
    return not await pods_in(kube, ns)


async def ended_states(processes: Processes, job: str, generation: int) -> set[int]:
    """The states job.lifecycle has for the job's `generation` once it COMPLETED (empty until then)."""
    events = await lifecycle(processes.kafka)
    states = {r.state for r in events if r.job.job_id == job and r.job.generation == generation}
    return states if events_pb2.JOB_STATE_COMPLETED in states else set()


async def test_binder_sigkilled_mid_500_binds_resumes_without_double_binding(
    kube: AsyncClient, processes: Processes
) -> None:
    await start(processes, kube, [node_object(f"gpu-{index:02d}", 8, rack=f"rack-{index // 8}") for index in range(70)])
    ns = await namespace(kube)
    objects: list[dict[str, Any]] = []
    rng = random.Random(5)
    count = 0
    index = 0
    while count < 500:
        size = min(rng.choice([1, 1, 1, 2, 4]), 500 - count)
        if size > 1:
            objects.append(podgroup_object(ns, f"g{index}", size))
            objects += [pod_object(ns, f"g{index}-{i}", gpus=1, group=f"g{index}") for i in range(size)]
        else:
            objects.append(pod_object(ns, f"p{index}", gpus=rng.choice([1, 1, 2])))
        count += size
        index += 1

    creating = asyncio.ensure_future(create_all(kube, objects))

    async def some_bound() -> bool:
        return len(bound(await pods_in(kube, ns))) >= 100

    await until(some_bound, timeout_s=120, what="100 pods bound before the kill")
    processes.kill_binder()
    await creating
    before = len(bound(await pods_in(kube, ns)))
    assert before < 500, "the kill came too late to be mid-stream"
    await processes.start_binder()
    await until(lambda: all_bound(kube, ns, 500), timeout_s=180, what="all 500 pods bound after the restart")
    pods = await pods_in(kube, ns)
    assert over_commits(pods) == []
    # one live bind per job: every pod's generation is its job's last BOUND in Placement's log, on that node
    records = await lifecycle(processes.kafka)
    last_bound: dict[str, events_pb2.JobLifecycle] = {}
    for record in records:
        if record.state == events_pb2.JOB_STATE_BOUND:
            last_bound[record.job.job_id] = record
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        job = annotations[core.JOB_ANNOTATION]
        assert int(annotations[core.GENERATION_ANNOTATION]) == last_bound[job].job.generation
        assert pod["spec"]["nodeName"] in {a.node for a in last_bound[job].assignments}


async def test_two_replicas_one_leader_and_the_standby_takes_over(kube: AsyncClient, processes: Processes) -> None:
    from lightkube.resources.coordination_v1 import Lease

    await start(processes, kube, [node_object(f"gpu-{index}", 8) for index in range(2)])
    standby = await processes.start_binder()  # ready, but waiting for the Lease
    lease = await kube.get(Lease, processes.lease, namespace="kube-system")
    assert lease.spec is not None and lease.spec.holderIdentity is not None
    assert lease.spec.holderIdentity.startswith("binder-0-")  # the first binder leads
    ns = await namespace(kube)
    await create_all(kube, [pod_object(ns, f"before-{i}", gpus=1) for i in range(4)])
    await until(lambda: all_bound(kube, ns, 4), timeout_s=60, what="pods bound by the leader")
    processes.kill_binder(0)
    await create_all(kube, [pod_object(ns, f"after-{i}", gpus=1) for i in range(4)])

    async def standby_leads() -> bool:
        current = await kube.get(Lease, processes.lease, namespace="kube-system")
        return bool(current.spec and (current.spec.holderIdentity or "").startswith("binder-1-"))

    await until(standby_leads, timeout_s=60, what="the standby to take the Lease")
    await until(lambda: all_bound(kube, ns, 8), timeout_s=60, what="pods bound by the new leader")
    assert standby.poll() is None
    assert over_commits(await pods_in(kube, ns)) == []


async def test_pod_scheduling_latency_and_binds_are_scraped_from_the_binder(
    kube: AsyncClient, processes: Processes
) -> None:
    """kumiki_binder_pod_scheduling_seconds: one observation per Binding created, each no longer than the pod
    has existed (its creationTimestamp, whole seconds, to the Binding); kumiki_binder_pods_bound_total counts
    the same binds."""
    import time

    await start(processes, kube, [node_object(f"lat-{index}", 8) for index in range(2)])
    ns = await namespace(kube)
    began = time.time()
    await create_all(kube, [pod_object(ns, f"solo-{i}", gpus=2) for i in range(5)])
    await until(lambda: all_bound(kube, ns, 5), timeout_s=120, what="5 pods bound")
    waited = time.time() - began

    def scraped() -> dict[str, float]:
        return binder_metrics(processes, "kumiki_binder_pod_scheduling_seconds", "kumiki_binder_pods_bound_total")

    metrics = await until(lambda: (m := scraped()).get("kumiki_binder_pods_bound_total") == 5 and m, 30, "scrape")
    assert metrics["kumiki_binder_pod_scheduling_seconds_count"] == 5
    assert 0 <= metrics["kumiki_binder_pod_scheduling_seconds_sum"] <= 5 * (waited + 1.0)  # +1: whole seconds


def _required_affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    term = {"matchExpressions": list(expressions)}
    return {"nodeAffinity": {core.REQUIRED_AFFINITY: {"nodeSelectorTerms": [term]}}}


async def test_taints_tolerations_node_selector_and_required_affinity(kube: AsyncClient, processes: Processes) -> None:
    tainted = node_object("tainted", 8)
    tainted["metadata"]["labels"]["kumiki.io/pool"] = "infer"
    tainted["spec"]["taints"] = [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
    nodes = [tainted]
    for name, zone in (("a1", "z1"), ("a2", "z2")):
        node = node_object(name, 4)
        node["metadata"]["labels"]["zone"] = zone
        nodes.append(node)
    await start(processes, kube, nodes)
    ns = await namespace(kube)

    def pod(name: str, **spec: Any) -> dict[str, Any]:
        obj = pod_object(ns, name, gpus=1)
        obj["spec"].update(spec)
        return obj

    # a1 and a2 (8 GPUs) are filled exactly; the tainted node's 8 free GPUs are for pods that tolerate it. The
    # pods tied to one zone go first: had the free-to-go pods come first, in whatever order the watch delivers
    # them, they could take a2's four GPUs and leave the z2 pods nowhere (as with any scheduler that does not
    # move running pods)
    tied = [
        *(
            pod(f"in-z2-{i}", affinity=_required_affinity({"key": "zone", "operator": "In", "values": ["z2"]}))
            for i in range(2)
        ),
        *(
            pod(f"not-z2-{i}", affinity=_required_affinity({"key": "zone", "operator": "NotIn", "values": ["z2"]}))
            for i in range(2)
        ),
    ]
    await create_all(kube, tied)
    await until(lambda: all_bound(kube, ns, 4), timeout_s=60, what="the zone-tied pods bound")
    free = [
        *(pod(f"zoned-{i}", affinity=_required_affinity({"key": "zone", "operator": "Exists"})) for i in range(2)),
        *(pod(f"plain-{i}") for i in range(2)),
    ]
    await create_all(kube, free)
    await until(lambda: all_bound(kube, ns, 8), timeout_s=60, what="the first 8 pods bound")
    placed = {item["metadata"]["name"]: item["spec"]["nodeName"] for item in await pods_in(kube, ns)}
    assert {placed["in-z2-0"], placed["in-z2-1"]} == {"a2"}
    assert {placed["not-z2-0"], placed["not-z2-1"]} == {"a1"}  # NotIn admits the tainted node, its taint does not
    assert "tainted" not in placed.values(), placed

    toleration = {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}
    infer = [pod(f"infer-{i}", tolerations=[toleration], nodeSelector={"kumiki.io/pool": "infer"}) for i in range(2)]
    await create_all(kube, infer)
    await until(lambda: all_bound(kube, ns, 10), timeout_s=60, what="the tolerating pods bound")
    # room is left only on the tainted node: a pod that does not tolerate it waits (FIFO: after the others)
    await create_all(kube, [pod("extra"), pod("nowhere", nodeSelector={"kumiki.io/pool": "train"})])

    async def settled() -> bool:
        pods = {item["metadata"]["name"]: item for item in await pods_in(kube, ns)}
        told = [(condition(pods[name]) or {}).get("status") == "False" for name in ("extra", "nowhere")]
        return all(told) and all(pods[f"infer-{i}"]["spec"].get("nodeName") for i in range(2))

    await until_or_say(kube, ns, settled, 60, "the tolerating pods bound, the others told why")
    pods = {item["metadata"]["name"]: item for item in await pods_in(kube, ns)}
    assert {pods["infer-0"]["spec"]["nodeName"], pods["infer-1"]["spec"]["nodeName"]} == {"tainted"}
    assert not pods["extra"]["spec"].get("nodeName") and not pods["nowhere"]["spec"].get("nodeName")
    nowhere = condition(pods["nowhere"]) or {}
    assert nowhere["reason"] == "NeverFits" and "0/3 nodes admit it" in nowhere["message"], nowhere
    extra = condition(pods["extra"]) or {}
    assert extra["reason"] == "Unschedulable" and "the 2 of 3 nodes its node rules admit" in extra["message"], extra
    assert over_commits(list(pods.values())) == []


ZONE_LABEL = "topology.kubernetes.io/zone"


def zoned_nodes(prefix: str) -> list[dict[str, Any]]:
    """Three nodes of 8 GPUs with their hostname label: two in zone za, the third in zb."""
    nodes = []
    for index, zone in enumerate(("za", "za", "zb"), start=1):
        node = node_object(f"{prefix}{index}", 8)
        node["metadata"]["labels"].update({core.HOSTNAME_LABEL: f"{prefix}{index}", ZONE_LABEL: zone})
        nodes.append(node)
    return nodes


def _pod_term(anti: bool, labels: dict[str, str], key: str = core.HOSTNAME_LABEL) -> dict[str, Any]:
    kind = "podAntiAffinity" if anti else "podAffinity"
    term = {"labelSelector": {"matchLabels": labels}, "topologyKey": key}
    return {kind: {core.REQUIRED_AFFINITY: [term]}}


async def test_pod_affinity_and_anti_affinity_between_gangs_replicas_and_placed_pods(
    kube: AsyncClient, processes: Processes
) -> None:
    await start(processes, kube, zoned_nodes("n"))
    ns = await namespace(kube)

    def pod(name: str, gpus: int = 1, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        obj = pod_object(ns, name, gpus=gpus, labels=labels, group=str(spec.pop("group", "")))
        obj["spec"].update(spec)
        return obj

    async def nodes_of() -> dict[str, str]:
        return {item["metadata"]["name"]: item["spec"].get("nodeName", "") for item in await pods_in(kube, ns)}

    # a pod that must be with a cache pod waits while there is none, and follows it once it is placed
    await create_all(kube, [pod("friend", affinity=_pod_term(False, {"app": "cache"}))])

    async def friend_told() -> bool:
        told = condition((await pods_in(kube, ns))[0]) or {}
        return "no placed pod matches its pod affinity term" in told.get("message", "")

    await until(friend_told, timeout_s=60, what="the friend pod told that no cache pod is placed")
    # the cache keeps pods of team noisy out of its zone (a placed pod's anti-affinity applies to newcomers)
    cache = pod("cache", labels={"app": "cache"}, affinity=_pod_term(True, {"team": "noisy"}, ZONE_LABEL))
    await create_all(kube, [cache])

    async def together() -> dict[str, str] | None:
        placed = await nodes_of()
        return placed if placed.get("friend") and placed.get("cache") else None

    placed = await until(together, timeout_s=60, what="the cache and its friend bound")
    assert placed["friend"] == placed["cache"]
    cache_zone = "zb" if placed["cache"] == "n3" else "za"

    # two gangs of 2 pods: one packed on a node as kumiki does, one whose workers repel each other
    worker = {"role": "worker"}
    gangs = [podgroup_object(ns, "packed", 2), podgroup_object(ns, "spread", 2)]
    gangs += [pod(f"packed-{i}", group="packed") for i in range(2)]
    gangs += [pod(f"spread-{i}", 1, worker, group="spread", affinity=_pod_term(True, worker)) for i in range(2)]
    # three replicas that repel each other, created at once, and a noisy pod
    replicas = [pod(f"web-{i}", labels={"app": "web"}, affinity=_pod_term(True, {"app": "web"})) for i in range(3)]
    await create_all(kube, [*gangs, *replicas, pod("noisy", labels={"team": "noisy"})])
    await until_or_say(kube, ns, lambda: all_bound(kube, ns, 10), 90, "every pod bound")
    placed = await nodes_of()
    assert placed["packed-0"] == placed["packed-1"], placed
    assert placed["spread-0"] != placed["spread-1"], placed
    assert len({placed[f"web-{i}"] for i in range(3)}) == 3, placed
    noisy_zone = "zb" if placed["noisy"] == "n3" else "za"
    assert noisy_zone != cache_zone, placed

    # two replicas that wait while every GPU is held, then are placed in the one pass that follows a release:
    # Placement knows nothing of pod affinity between jobs and packs both on the freed node, so the binder
    # refuses the second at its bind (the first is placed by then) and sends it again with that node barred
    used = {name: list(placed.values()).count(name) for name in ("n1", "n2", "n3")}  # every pod has 1 GPU
    hogs = [pod(f"hog-{name}", 8 - count, nodeSelector={core.HOSTNAME_LABEL: name}) for name, count in used.items()]
    await create_all(kube, hogs)
    await until(lambda: all_bound(kube, ns, 13), timeout_s=60, what="every GPU held")
    db = [pod(f"db-{i}", labels={"app": "db"}, affinity=_pod_term(True, {"app": "db"})) for i in range(2)]
    await create_all(kube, db)
    await until(lambda: told(kube, ns, ["db-0", "db-1"]), timeout_s=60, what="the replicas told they wait")
    for hog in hogs:
        await kube.delete(Pod, hog["metadata"]["name"], namespace=ns)
    await until(lambda: all_bound(kube, ns, 12), timeout_s=60, what="both replicas bound")
    placed = await nodes_of()
    assert placed["db-0"] != placed["db-1"], placed

    # a pod kept off both replicas' nodes waits for the third, which is full; when a replica leaves, the lists
    # Placement holds for it are resolved again and it takes the freed node
    (third,) = {"n1", "n2", "n3"} - {placed["db-0"], placed["db-1"]}
    held = list(placed.values()).count(third)
    await create_all(kube, [pod("hog", 8 - held, nodeSelector={core.HOSTNAME_LABEL: third})])
    await until(lambda: all_bound(kube, ns, 13), timeout_s=60, what="the third node full")
    await create_all(kube, [pod("apart", affinity=_pod_term(True, {"app": "db"}))])
    await until(lambda: told(kube, ns, ["apart"]), timeout_s=60, what="the pod kept apart told it waits")
    await kube.delete(Pod, "db-0", namespace=ns)
    await until(lambda: all_bound(kube, ns, 13), timeout_s=60, what="the pod kept apart bound")
    assert (await nodes_of())["apart"] == placed["db-0"]
    assert over_commits(await pods_in(kube, ns)) == []
    # both ways round are counted: the replica sent back at its bind, the waiting pod's lists refreshed
    counted = binder_metrics(processes, "kumiki_binder_gangs_sent_back", "kumiki_binder_affinity_lists_refreshed")
    assert counted.get("kumiki_binder_gangs_sent_back_total", 0) >= 1, counted  # only why=pod_affinity here
    assert counted.get("kumiki_binder_affinity_lists_refreshed_total", 0) >= 1, counted


async def test_topology_spread_keeps_replicas_created_at_once_within_max_skew(
    kube: AsyncClient, processes: Processes
) -> None:
    await start(processes, kube, zoned_nodes("s"))
    ns = await namespace(kube)

    def spread(key: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = {"matchLabels": labels}
        return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "DoNotSchedule", "labelSelector": selector}]

    # six replicas at once, spread over the two zones: kumiki alone would pack them on one node; Placement
    # answers them concurrently, so the lists go stale and the binds are checked again
    web = {"app": "web"}
    replicas = []
    for i in range(6):
        replica = pod_object(ns, f"web-{i}", gpus=1, labels=web)
        replica["spec"]["topologySpreadConstraints"] = spread(ZONE_LABEL, web)
        replicas.append(replica)
    # a gang whose workers spread over hosts: a node each
    worker = {"role": "worker"}
    gang: list[dict[str, Any]] = [podgroup_object(ns, "workers", 2)]
    for i in range(2):
        member = pod_object(ns, f"worker-{i}", gpus=1, group="workers", labels=worker)
        member["spec"]["topologySpreadConstraints"] = spread(core.HOSTNAME_LABEL, worker)
        gang.append(member)
    await create_all(kube, [*replicas, *gang])
    await until(lambda: all_bound(kube, ns, 8), timeout_s=90, what="every pod bound")
    placed = {item["metadata"]["name"]: item["spec"]["nodeName"] for item in await pods_in(kube, ns)}
    zones = [("zb" if placed[f"web-{i}"] == "s3" else "za") for i in range(6)]
    assert sorted(zones) == ["za"] * 3 + ["zb"] * 3, placed
    assert placed["worker-0"] != placed["worker-1"], placed
    assert over_commits(await pods_in(kube, ns)) == []


async def test_other_schedulers_pods_count_when_the_binder_watches_them(
    kube: AsyncClient, processes: Processes
) -> None:
    await start(processes, kube, zoned_nodes("o"), KUMIKI_BINDER_OTHER_PODS="true")
    ns = await namespace(kube)
    # two pods another scheduler placed: a cache on o2, and a guard on o3 (zone zb) that keeps noisy pods out
    cache = pod_object(ns, "cache", scheduler="default-scheduler", labels={"app": "cache"})
    guard = pod_object(ns, "guard", scheduler="default-scheduler", labels={"app": "guard"})
    cache["spec"]["nodeName"], guard["spec"]["nodeName"] = "o2", "o3"
    guard["spec"]["affinity"] = _pod_term(True, {"team": "noisy"}, ZONE_LABEL)
    await create_all(kube, [cache, guard])

    def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        obj = pod_object(ns, name, gpus=1, labels=labels)
        obj["spec"].update(spec)
        return obj

    await create_all(
        kube,
        [
            pod("near", affinity=_pod_term(False, {"app": "cache"})),
            pod("apart", affinity=_pod_term(True, {"app": "cache"})),
            pod("noisy", labels={"team": "noisy"}),
        ],
    )
    await until(lambda: all_bound(kube, ns, 5), timeout_s=90, what="the three kumiki pods bound")
    placed = {item["metadata"]["name"]: item["spec"]["nodeName"] for item in await pods_in(kube, ns)}
    assert placed["near"] == "o2" and placed["apart"] != "o2" and placed["noisy"] != "o3", placed


async def test_a_waiting_pod_a_later_placed_pods_anti_affinity_restricts_is_resolved_again(
    kube: AsyncClient, processes: Processes
) -> None:
    """Symmetry while a gang waits: a pod placed after it was queued, whose anti-affinity selects it, changes
    its lists at once, so Placement never places it where the bind would refuse it. The pod placed later is
    another scheduler's (it can take a node while kumiki's queue waits; a pod kumiki binds goes through the
    same step, `restrict_waiting`, at its bind)."""
    await start(processes, kube, zoned_nodes("y"), KUMIKI_BINDER_OTHER_PODS="true")
    ns = await namespace(kube)

    def pod(name: str, gpus: int, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        obj = pod_object(ns, name, gpus=gpus, labels=labels)
        obj["spec"].update(spec)
        return obj

    hogs = {"y1": 8, "y2": 8, "y3": 8}
    await create_all(
        kube, [pod(f"hog-{name}", gpus, nodeSelector={core.HOSTNAME_LABEL: name}) for name, gpus in hogs.items()]
    )
    await until(lambda: all_bound(kube, ns, 3), timeout_s=60, what="every node full")
    await create_all(kube, [pod("noisy", 4, {"team": "noisy"})])
    await until(lambda: told(kube, ns, ["noisy"]), timeout_s=60, what="the noisy pod told it waits")
    # another scheduler's guard on y3 keeps noisy pods out of its zone (zb)
    guard = pod_object(ns, "guard", scheduler="default-scheduler", labels={"app": "guard"})
    guard["spec"]["nodeName"] = "y3"
    guard["spec"]["affinity"] = _pod_term(True, {"team": "noisy"}, ZONE_LABEL)
    await create_all(kube, [guard])

    def counted() -> dict[str, float]:
        return binder_metrics(processes, "kumiki_binder_gangs_sent_back", "kumiki_binder_affinity_lists_refreshed")

    async def refreshed() -> bool:
        return counted().get("kumiki_binder_affinity_lists_refreshed_total", 0) >= 1

    await until(refreshed, timeout_s=30, what="the waiting noisy pod's lists resolved again")
    # room on y3 first, where Placement would put the noisy pod were it not kept out of zb, then on y1
    await kube.delete(Pod, "hog-y3", namespace=ns)
    await kube.delete(Pod, "hog-y1", namespace=ns)
    await until_or_say(kube, ns, lambda: all_bound(kube, ns, 3), 60, "the noisy pod bound", counted)
    placed = {item["metadata"]["name"]: item["spec"]["nodeName"] for item in await pods_in(kube, ns)}
    assert placed["noisy"] == "y1", placed
    assert counted().get("kumiki_binder_gangs_sent_back_total", 0) == 0, counted()  # never placed where barred


PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
PREFER_NO_SCHEDULE_TOLERATION = [{"key": "spot", "operator": "Exists", "effect": "PreferNoSchedule"}]


async def test_preferences_rank_nodes_and_never_make_a_pod_wait(kube: AsyncClient, processes: Processes) -> None:
    nodes = zoned_nodes("p")
    nodes[0]["spec"]["taints"] = [{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}]
    await start(processes, kube, nodes)
    ns = await namespace(kube)

    def pod(name: str, gpus: int = 1, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
        obj = pod_object(ns, name, gpus=gpus, labels=labels)
        obj["spec"].update(spec)
        return obj

    async def one_by_one(pods: list[dict[str, Any]]) -> dict[str, str]:
        """Each pod created once the one before it is bound (so each is scored against those before it)."""
        for obj in pods:
            await create_all(kube, [obj])
            count = len(await pods_in(kube, ns))
            await until(
                lambda count=count: all_bound(kube, ns, count), timeout_s=60, what=f"{obj['metadata']['name']} bound"
            )
        return {item["metadata"]["name"]: item["spec"]["nodeName"] for item in await pods_in(kube, ns)}

    # p1 has a PreferNoSchedule taint: a pod that does not tolerate it goes elsewhere while it can (kumiki alone
    # would pack it on p1, the first of three empty nodes)
    placed = await one_by_one([pod("plain")])
    assert placed["plain"] != "p1", placed
    # replicas with preferred anti-affinity on the hostname, one after another: a node each (kumiki alone packs
    # them on the node already in use)
    web = {"app": "web"}
    apart = {
        "podAntiAffinity": {
            PREFERRED: [
                {"weight": 100, "podAffinityTerm": _pod_term(True, web)["podAntiAffinity"][core.REQUIRED_AFFINITY][0]}
            ]
        }
    }
    replicas = [
        pod(f"web-{i}", labels=web, affinity=apart, tolerations=PREFER_NO_SCHEDULE_TOLERATION) for i in range(3)
    ]
    placed = await one_by_one(replicas)
    assert len({placed[f"web-{i}"] for i in range(3)}) == 3, placed
    # ScheduleAnyway spread over zones, one after another: two in each zone
    api = {"app": "api"}
    skew = [
        {
            "maxSkew": 1,
            "topologyKey": ZONE_LABEL,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": api},
        }
    ]
    placed = await one_by_one(
        [
            pod(f"api-{i}", labels=api, topologySpreadConstraints=skew, tolerations=PREFER_NO_SCHEDULE_TOLERATION)
            for i in range(4)
        ]
    )
    zones = sorted("zb" if placed[f"api-{i}"] == "p3" else "za" for i in range(4))
    assert zones == ["za", "za", "zb", "zb"], placed
    # preferred node affinity: to zone zb (p3) when it fits there, and elsewhere when it does not: a preference
    # never makes a pod wait
    to_zb = {
        "nodeAffinity": {
            PREFERRED: [
                {
                    "weight": 50,
                    "preference": {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": ["zb"]}]},
                }
            ]
        }
    }
    placed = await one_by_one([pod("near", affinity=to_zb)])
    assert placed["near"] == "p3", placed
    free_on_p3 = 8 - list(placed.values()).count("p3")
    placed = await one_by_one([pod("wide", free_on_p3 + 1, affinity=to_zb, tolerations=PREFER_NO_SCHEDULE_TOLERATION)])
    assert placed["wide"] != "p3", placed
    assert over_commits(await pods_in(kube, ns)) == []


async def test_a_waiting_pods_scores_follow_the_pods_placed_meanwhile(kube: AsyncClient, processes: Processes) -> None:
    """A queued pod whose preferences count other pods (preferred anti-affinity) is scored again when such a
    pod is placed, and submitted again with the new scores: Placement then ranks the nodes as they are."""
    await start(processes, kube, zoned_nodes("w"), KUMIKI_BINDER_OTHER_PODS="true")
    ns = await namespace(kube)
    hogs = [pod_object(ns, f"hog-{name}", gpus=8) for name in ("w1", "w2", "w3")]
    for hog in hogs:
        hog["spec"]["nodeSelector"] = {core.HOSTNAME_LABEL: hog["metadata"]["name"].removeprefix("hog-")}
    await create_all(kube, hogs)
    await until(lambda: all_bound(kube, ns, 3), timeout_s=60, what="every node full")
    apart = pod_object(ns, "apart", gpus=4)
    term = _pod_term(True, {"app": "web"})["podAntiAffinity"][core.REQUIRED_AFFINITY][0]
    apart["spec"]["affinity"] = {"podAntiAffinity": {PREFERRED: [{"weight": 100, "podAffinityTerm": term}]}}
    await create_all(kube, [apart])
    await until(lambda: told(kube, ns, ["apart"]), timeout_s=60, what="the pod told it waits")

    def refreshed() -> float:
        counted = binder_metrics(processes, "kumiki_binder_affinity_lists_refreshed")
        return counted.get("kumiki_binder_affinity_lists_refreshed_total", 0)

    assert refreshed() == 0
    web = pod_object(ns, "web", scheduler="default-scheduler", labels={"app": "web"})
    web["spec"]["nodeName"] = "w3"
    await create_all(kube, [web])

    async def scored_again() -> bool:
        return refreshed() >= 1

    await until(scored_again, timeout_s=30, what="the waiting pod scored again and submitted with its new scores")


async def test_a_recreated_worker_takes_the_place_of_the_one_deleted(kube: AsyncClient, processes: Processes) -> None:
    """A placed gang whose worker is deleted and recreated (as a Job or training operator does) binds the new
    pod to the node and GPUs Placement still holds for the gang; one asking for something else is told that the
    group was placed before it joined."""
    await start(processes, kube, [node_object(f"r{index}", 8) for index in range(2)])
    ns = await namespace(kube)
    group = [podgroup_object(ns, "train", 2)]
    group += [pod_object(ns, f"worker-{index}", gpus=6, group="train") for index in range(2)]
    await create_all(kube, group)
    await until(lambda: all_bound(kube, ns, 2), timeout_s=60, what="the gang bound")
    before = {item["metadata"]["name"]: item for item in await pods_in(kube, ns)}
    await kube.delete(Pod, "worker-1", namespace=ns)

    async def gone() -> bool:
        return "worker-1" not in {item["metadata"]["name"] for item in await pods_in(kube, ns)}

    await until(gone, timeout_s=60, what="worker-1 deleted")
    # 6 of each node's 8 GPUs are the gang's: a new 2-GPU pod of the group has no place; a new 6-GPU one has
    await create_all(
        kube,
        [pod_object(ns, "worker-1-again", gpus=6, group="train"), pod_object(ns, "extra", gpus=2, group="train")],
    )

    async def replaced() -> bool:
        pods = {item["metadata"]["name"]: item for item in await pods_in(kube, ns)}
        again = pods.get("worker-1-again") or {}
        return bool((again.get("spec") or {}).get("nodeName")) and await told(kube, ns, ["extra"])

    await until(replaced, timeout_s=60, what="the recreated worker bound and the extra pod told")
    after = {item["metadata"]["name"]: item for item in await pods_in(kube, ns)}
    old, new = before["worker-1"], after["worker-1-again"]
    assert new["spec"]["nodeName"] == old["spec"]["nodeName"]
    for annotation in (core.JOB_ANNOTATION, core.GENERATION_ANNOTATION, core.GPU_INDICES_ANNOTATION):
        assert new["metadata"]["annotations"][annotation] == old["metadata"]["annotations"][annotation], annotation
    assert (condition(after["extra"]) or {}).get("reason") == "GroupAlreadyPlaced", after["extra"]
    assert over_commits(list(after.values())) == []
    counted = binder_metrics(processes, "kumiki_binder_replacements")
    assert counted.get("kumiki_binder_replacements_total") == 1, counted


async def test_the_next_generations_pods_made_during_an_eviction_wait_for_its_release(
    kube: AsyncClient, processes: Processes
) -> None:
    """A job controller recreates an evicted gang's pods as soon as the old ones are gone, which can be before the
    coordinator's PREEMPTED reaches the binder. They are the next generation, not replacements of the members the
    eviction deleted: Placement may have given those GPUs to the job the eviction was for. (They once were taken
    for replacements and bound there, over a GPU another job held; found by the replay through KWOK.)"""
    ns, job = await bound_victim(kube, processes, gpus_each=4)
    await send_evict(processes, job, 1, "c-evict")
    await until(lambda: no_pods(kube, ns), timeout_s=60, what="the first generation's pods evicted")
    # no PREEMPTED yet (no coordinator here): the controller's next pods ask for exactly what the evicted ones did
    await create_all(kube, next_generation(ns, gpus_each=4))

    async def waiting_for_the_release() -> bool:
        pods = await pods_in(kube, ns)
        reasons = {(condition(pod) or {}).get("reason") for pod in pods}
        return len(pods) == 2 and reasons == {"PreviousGenerationEvicting"}

    await until_or_say(kube, ns, waiting_for_the_release, 60, "the next generation's pods told they wait")
    assert bound(await pods_in(kube, ns)) == []
    assert awaiting_release(processes) == 1
    replaced = binder_metrics(processes, "kumiki_binder_replacements")
    assert replaced.get("kumiki_binder_replacements_total") == 0, replaced

    # the coordinator's release: the pods go to Placement as generation 2, are bound and run
    await release_preempted(processes, job)
    states = await until(lambda: ended_states(processes, job, 2), timeout_s=60, what="the second generation COMPLETED")
    assert {events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING} <= states
    pods = await pods_in(kube, ns)
    assert {pod["metadata"]["annotations"][core.GENERATION_ANNOTATION] for pod in pods} == {"2"}
    assert over_commits(pods) == []
    assert awaiting_release(processes) == 0


async def test_an_evict_command_for_an_attempt_that_already_completed_waits_for_no_release(
    kube: AsyncClient, processes: Processes
) -> None:
    """The coordinator decided to evict a job that then finished on its own: its EVICT comes after the COMPLETED
    (or the two are read in either order). No PREEMPTED release will ever come, so the binder must not wait for
    one (it once kept the eviction for as long as it ran, counted in no metric)."""
    await start(processes, kube, [node_object("gpu-0", 8)])
    ns = await namespace(kube)
    pods = [pod_object(ns, f"quick-{i}", gpus=2, group="quick", run_for="1s") for i in range(2)]
    await create_all(kube, [podgroup_object(ns, "quick", 2), *pods])
    job = f"{ns}/quick"
    await until(lambda: ended_states(processes, job, 1), timeout_s=60, what="the gang COMPLETED")
    await send_evict(processes, job, 1, "c-after-the-end")
    commands = "kumiki_binder_preemption_commands_total"
    await until(lambda: binder_metrics(processes, commands).get(commands) == 1, 30, "the binder to read the command")
    # read after the COMPLETED, it is not recorded; read before it, the COMPLETED ends it
    await until(lambda: awaiting_release(processes) == 0, 30, "no eviction left waiting for a release")


def awaiting_release(processes: Processes) -> float | None:
    """The first binder's evictions waiting for their PREEMPTED release (None while /metrics does not answer)."""
    gauge = "kumiki_binder_evictions_awaiting_release"
    return binder_metrics(processes, gauge).get(gauge)


async def test_podgroup_schedule_timeout_is_told_and_frees_the_queue(kube: AsyncClient, processes: Processes) -> None:
    await start(processes, kube, [node_object(f"gpu-{index}", 8) for index in range(2)])
    ns = await namespace(kube)
    slow = podgroup_object(ns, "slow", 3)
    slow["spec"]["scheduleTimeoutSeconds"] = 3
    await create_all(kube, [slow, *(pod_object(ns, f"slow-{i}", gpus=8, group="slow") for i in range(3))])

    async def timed_out() -> bool:
        pods = await pods_in(kube, ns)
        return len(pods) == 3 and all((condition(pod) or {}).get("reason") == "ScheduleTimeout" for pod in pods)

    await until_or_say(kube, ns, timed_out, 60, "every pod of the gang told its scheduleTimeoutSeconds passed")
    pods = await pods_in(kube, ns)
    assert not bound(pods)
    message = (condition(pods[0]) or {})["message"]
    assert "past its scheduleTimeoutSeconds (3)" in message and "GPU" in message, message

    async def group_failed() -> bool:  # the binder writes the group's phase after telling its pods
        group = await kube.get(PodGroup, "slow", namespace=ns)
        return group.status["phase"] == "Failed"  # type: ignore[index]

    await until(group_failed, timeout_s=30, what="the PodGroup's phase Failed once its pods were told")

    async def group_told() -> bool:
        events = [event async for event in kube.list(Event, namespace=ns)]
        return any(
            e.involvedObject.kind == "PodGroup" and (e.message or "").startswith("ScheduleTimeout") for e in events
        )

    await until(group_told, timeout_s=30, what="an Event on the PodGroup saying its scheduleTimeoutSeconds passed")
    records = await lifecycle(processes.kafka)
    assert any(r.job.job_id == f"{ns}/slow" and r.state == events_pb2.JOB_STATE_RELEASED for r in records)

    # the group's terms change (two members are enough now): it tries again and places what fits
    await kube.patch(PodGroup, "slow", {"spec": {"minMember": 2}}, namespace=ns, patch_type=PatchType.MERGE)

    async def two_bound() -> bool:
        return len(bound(await pods_in(kube, ns))) == 2

    await until(two_bound, timeout_s=60, what="the gang placed with its new minMember")

    async def group_placed() -> bool:  # the binder writes the group's phase after its pods' Bindings
        group = await kube.get(PodGroup, "slow", namespace=ns)
        return group.status["phase"] in ("Scheduled", "Running")  # type: ignore[index]

    await until(group_placed, timeout_s=30, what="the PodGroup's phase Scheduled or Running, no longer Failed")
