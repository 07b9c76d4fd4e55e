"""Binder wiring: wait for the leader Lease, rebuild from Placement's log and the API, then watch pods,
nodes and PodGroups, bind what Placement places, and evict on preemption commands."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

import grpc

from kumiki.binder.adapters.controller import Binder
from kumiki.binder.adapters.kube import (
    KubeApi,
    client_from,
    config_from,
    identity,
    is_transient,
    kubeconfig_from_env,
    server_of,
)
from kumiki.binder.adapters.lane import ApiLane
from kumiki.binder.adapters.placement import PlacementClient
from kumiki.common.bus import EventConsumer
from kumiki.common.bus.replay import TopicReader
from kumiki.common.bus.topics import CLUSTER_STATE, JOB_LIFECYCLE, PREEMPTION_COMMANDS
from kumiki.common.config import ConfigError, env_bool, env_float, env_int, env_str
from kumiki.common.grpcutil import channel_credentials
from kumiki.common.service import Runtime, ServiceSpec

log = logging.getLogger(__name__)
T = TypeVar("T")
SYNC_RETRY_S = 120.0  # how long the leader's first lists wait out a busy API server before the process exits


class LostLeadership(RuntimeError):
    """Another replica holds the Lease now: this one exits (and is restarted as a standby)."""


async def _watch(
    name: str,
    source: Callable[[], AsyncIterator[tuple[str, dict[str, Any]]]],
    handle: Callable[[str, dict[str, Any]], Awaitable[None]],
) -> None:
    async for kind, obj in source():
        try:
            await handle(kind, obj)
        except Exception:  # one bad object must not stop the watch
            log.exception("watch handler failed", extra={"watch": name})


async def _until_answered(what: str, call: Callable[[], Awaitable[T]], deadline_s: float = SYNC_RETRY_S) -> T:
    """The leader's first lists, asked again with backoff while the API server is busy or away (a 429 while
    its watch cache fills, a 5xx, a lost connection): a new leader must not exit on a moment's overload,
    which is exactly when a binder restarts (a restart would only ask again, later). Past `deadline_s`, or on
    any other error, the error stands."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    delay = 0.2
    while True:
        try:
            return await call()
        except Exception as error:
            if not is_transient(error) or loop.time() + delay > deadline:
                raise
            log.warning("API server busy: asking again", extra={"what": what, "reason": str(error), "in_s": delay})
        await asyncio.sleep(delay)
        delay = min(5.0, delay * 2)


async def _hold_lease(kube: KubeApi, namespace: str, name: str, duration_s: int, stopping: asyncio.Event) -> None:
    """Renew the Lease every third of its duration; exit the process when it cannot be renewed in time."""
    last = asyncio.get_running_loop().time()
    while not stopping.is_set():
        await asyncio.sleep(duration_s / 3)
        try:
            if await kube.try_lease(namespace, name, duration_s):
                last = asyncio.get_running_loop().time()
                continue
            raise LostLeadership(f"lease {namespace}/{name} taken by another binder")
        except LostLeadership:
            raise
        except Exception as error:
            log.warning("lease renewal failed", extra={"reason": str(error)})
        if asyncio.get_running_loop().time() - last > duration_s * 2 / 3:
            raise LostLeadership(f"lease {namespace}/{name} not renewed for {duration_s * 2 / 3:.0f}s")


def placement_credentials(env: Mapping[str, str]) -> grpc.ChannelCredentials | None:
    """TLS to Placement: its CA (KUMIKI_PLACEMENT_CAFILE) and, for mTLS, the binder's own certificate
    (KUMIKI_PLACEMENT_CERTFILE and KUMIKI_PLACEMENT_KEYFILE). None: plaintext."""
    return channel_credentials(env, "KUMIKI_PLACEMENT")


async def wire(runtime: Runtime, server: grpc.aio.Server) -> None:
    env = os.environ
    address = env_str(env, "KUMIKI_PLACEMENT_ADDRESS", "127.0.0.1:50051")
    if ":" not in address:
        raise ConfigError(f"KUMIKI_PLACEMENT_ADDRESS: expected host:port, got {address!r}")
    lease_namespace = env_str(env, "KUMIKI_BINDER_LEASE_NAMESPACE", "kube-system")
    lease_name = env_str(env, "KUMIKI_BINDER_LEASE_NAME", "kumiki-binder")
    lease_s = env_int(env, "KUMIKI_BINDER_LEASE_SECONDS", 15, minimum=3, maximum=600)
    concurrency = env_int(env, "KUMIKI_BINDER_CONCURRENCY", 256, minimum=1, maximum=4096)
    scheduled_events = env_bool(env, "KUMIKI_BINDER_SCHEDULED_EVENTS", True)
    reason_refresh_s = env_float(env, "KUMIKI_BINDER_REASON_REFRESH_S", 30.0, minimum=0, maximum=3600)
    other_pods = env_bool(env, "KUMIKI_BINDER_OTHER_PODS", False)
    kubeconfig = kubeconfig_from_env(env)
    if kubeconfig is not None and not kubeconfig.is_file():
        raise ConfigError(f"KUMIKI_KUBECONFIG: no such file {kubeconfig}")
    me = identity()
    config = config_from(kubeconfig)
    lane = ApiLane.from_config(config) if env_bool(env, "KUMIKI_BINDER_FAST_LANE", True) else None
    if lane is None:
        log.info("no fast lane for this kubeconfig's authentication: lightkube serves every call")
    kube = KubeApi(client_from(kubeconfig, config), me, lane, server_of(config))
    runtime.closers.append(kube.close)
    placement = PlacementClient(address, placement_credentials(env))
    runtime.closers.append(placement.close)
    binder = Binder(
        kube,
        placement,
        runtime.producer,
        concurrency=concurrency,
        scheduled_events=scheduled_events,
        reason_refresh_s=reason_refresh_s,
        other_pods=other_pods,
    )
    runtime.components.update(binder=binder)
    lease = (lease_namespace, lease_name, lease_s)
    # a standby replica is alive and ready, and waits for the Lease in the background touching nothing
    runtime.background.append(asyncio.create_task(_lead(runtime, kube, binder, lease), name="lead"))


async def _lead(runtime: Runtime, kube: KubeApi, binder: Binder, lease: tuple[str, str, int]) -> None:
    """Once this replica holds the Lease: rebuild from Placement's log and the API, then run every loop."""
    namespace, name, duration_s = lease
    while not await _until_answered("take the lease", lambda: kube.try_lease(namespace, name, duration_s)):
        log.info("standby: waiting for the leader lease", extra={"lease": f"{namespace}/{name}"})
        try:
            await asyncio.wait_for(runtime.stopping.wait(), timeout=duration_s / 3)
            return
        except TimeoutError:
            pass
    log.info("leader", extra={"identity": kube.identity, "lease": f"{namespace}/{name}"})

    async def give_up_lease() -> None:
        await kube.release_lease(namespace, name)

    runtime.closers.insert(0, give_up_lease)  # before the API client closes
    stopping = runtime.stopping
    background = runtime.background
    background.append(asyncio.create_task(_hold_lease(kube, namespace, name, duration_s, stopping), name="lease"))
    # Placement's log to its end: each job's last generation and state
    lifecycle = TopicReader(runtime.settings.kafka, JOB_LIFECYCLE, binder.on_lifecycle)
    await lifecycle.start()
    runtime.closers.append(lifecycle.stop)
    await lifecycle.catch_up()
    telemetry = TopicReader(runtime.settings.kafka, CLUSTER_STATE, binder.on_cluster_state)
    await telemetry.start()
    runtime.closers.append(telemetry.stop)
    await telemetry.catch_up()
    # the API's state, then watches from the lists' versions
    nodes, nodes_version = await _until_answered("list nodes", kube.list_nodes)
    for node in nodes:
        await binder.on_node("ADDED", node)
    podgroups = await _until_answered("PodGroup CRD served", kube.podgroups_served)
    groups_version = ""
    if podgroups:
        groups, groups_version = await _until_answered("list podgroups", kube.list_podgroups)
        for group in groups:
            await binder.on_podgroup("ADDED", group)
    else:
        log.warning("the PodGroup CRD is not installed: gangs come from the pod-group label only")
    pods, pods_version = await _until_answered("list pods", kube.list_pods)
    for pod in pods:
        await binder.on_pod("ADDED", pod)
    others_version = ""
    if binder.other_pods is not None:  # other schedulers' bound pods, for pod affinity and topology spread
        others, others_version = await _until_answered("list other pods", lambda: kube.list_pods(others=True))
        for pod in others:
            await binder.on_other_pod("ADDED", pod)
    binder.reconcile()
    binder.synced.set()
    log.info("binder synced", extra={"nodes": len(nodes), "pods": len(pods), "jobs_in_log": len(binder.logged)})

    def loop(coroutine: Coroutine[Any, Any, None], task_name: str) -> None:
        background.append(asyncio.create_task(coroutine, name=task_name))

    loop(lifecycle.follow(stopping), "follow-job-lifecycle")
    loop(telemetry.follow(stopping), "follow-cluster-state")
    loop(_watch("nodes", lambda: kube.watch_nodes(nodes_version), binder.on_node), "watch-nodes")
    if podgroups:
        loop(_watch("podgroups", lambda: kube.watch_podgroups(groups_version), binder.on_podgroup), "watch-podgroups")
    loop(_watch("pods", lambda: kube.watch_pods(pods_version), binder.on_pod), "watch-pods")
    if binder.other_pods is not None:
        watch_others = _watch("other pods", lambda: kube.watch_pods(others_version, others=True), binder.on_other_pod)
        loop(watch_others, "watch-other-pods")
    loop(binder.run_submissions(stopping), "submissions")
    loop(binder.run_events(stopping), "events")
    # preemption commands: only the leader joins the group (a standby would take partitions it cannot serve)
    commands = EventConsumer(
        runtime.settings.kafka, [PREEMPTION_COMMANDS], "kumiki-binder", binder.on_preemption, runtime.producer
    )
    await commands.start()
    runtime.closers.append(commands.stop)
    loop(commands.run(), "consume-preemption-commands")


SPEC = ServiceSpec(name="binder", grpc_port=50057, http_port=8087, wire=wire)
