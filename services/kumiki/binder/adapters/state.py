"""What every part of the `Binder` shares: its in-memory state, its background tasks, Releases to Placement,
its node records on cluster.state and its Kubernetes Events. The parts themselves (watches, submissions,
bindings, evictions) are mixins over `BinderState`, each in its own module."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from kumiki.binder import core
from kumiki.binder.adapters import convert
from kumiki.binder.adapters.kube import KubeApi
from kumiki.binder.adapters.metrics import EVENTS_DROPPED
from kumiki.binder.adapters.placement import PlacementClient
from kumiki.binder.core import Gang, Pod, PodKey
from kumiki.common.bus import EventProducer
from kumiki.common.bus.topics import CLUSTER_STATE
from kumiki.common.contracts.v1 import events_pb2
from kumiki.common.grpcutil import timestamp
from kumiki.sched.jobs import PodRequest

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.binder")


def counts_other_pods(pod: Pod) -> bool:
    """Whether the pod's terms or constraints (required or preferred) are matched against other placed pods."""
    return bool(pod.affinity or pod.spread or pod.preferences.pod_terms or pod.preferences.spread)


def gang_attributes(gang: Gang, generation: int, pods: int, trigger: str) -> dict[str, str | int]:
    """The binder's span for a gang: the same job keys as Placement's `schedule` span, and what started it
    (`submit`: the binder asked Placement; `cycle`: Placement's scheduling pass bound it later, on job.lifecycle;
    `preemption`: an EVICT command)."""
    attributes: dict[str, str | int] = {
        "kumiki.job.id": gang.job_id,
        "kumiki.job.generation": generation,
        "kumiki.pods": pods,
        "kumiki.binder.trigger": trigger,
        "k8s.namespace.name": gang.namespace,
    }
    if gang.group:
        attributes["kumiki.podgroup"] = gang.group
    return attributes


@dataclass
class LoggedJob:
    """A job's last word in Placement's log."""

    generation: int
    state: int
    assignments: list[core.PodAssignment]
    pods: list[PodRequest | None]  # None: a logged request that is not one (never the same as a pod's)


class BinderState:
    """The state the mixins share; built empty, filled from Placement's log and the API's lists at start."""

    def __init__(
        self,
        kube: KubeApi,
        placement: PlacementClient,
        producer: EventProducer,
        *,
        concurrency: int = 256,
        scheduled_events: bool = True,
        settle_s: float = 0.5,
        busy_event_interval_s: float = 0.02,
        reason_refresh_s: float = 30.0,
        other_pods: bool = False,
    ) -> None:
        self.kube = kube
        self.placement = placement
        self.producer = producer
        self.gangs: dict[str, Gang] = {}
        self.nodes: dict[str, core.Node] = {}
        self.telemetry: dict[str, events_pb2.NodeState] = {}
        self.published: dict[str, events_pb2.NodeState] = {}
        self.logged: dict[str, LoggedJob] = {}
        self.min_members: dict[tuple[str, str], tuple[int, str]] = {}  # (namespace, group) -> (minMember, uid)
        self.timeouts: dict[tuple[str, str], int] = {}  # (namespace, group) -> scheduleTimeoutSeconds (0: none)
        self.wake = asyncio.Event()
        self.busy: set[str] = set()  # gangs with a submission or binding in flight
        # job -> the generation a preemption command evicts, until the coordinator's PREEMPTED release of it is
        # read: its pods ending meanwhile are the eviction, not the job's end. The two arrive on different topics,
        # in either order, so a command for a generation already released is not recorded at all.
        self.evicting: dict[str, int] = {}
        self.retry_at: dict[str, float] = {}
        self.slots = asyncio.Semaphore(concurrency)
        self.scheduled_events = scheduled_events
        self.events: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue(maxsize=10_000)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.synced = asyncio.Event()
        self.node_changes = 0
        self.dirty: set[str] = set()
        self.told_late: dict[str, set[PodKey]] = {}  # per job: the late pods told why they wait
        self.never_fit: set[str] = set()
        self.settle_s = settle_s
        # a gang queued in Placement shows Placement's reason as of now, asked again this often (0: never)
        self.reason_refresh_s = reason_refresh_s
        self._known_pods: dict[str, Pod] = {}  # by uid: a pod's spec is immutable, its request read once
        self.capacity: core.ClusterCapacity | None = None  # the largest node shapes (never_fits), None: stale
        self.binding = 0  # gangs whose Bindings are being created now (Events wait behind them)
        self.quiet = asyncio.Event()  # set while no Bindings are being created
        self.quiet.set()
        self.busy_event_interval_s = busy_event_interval_s
        # pod (anti-)affinity: the node of each pod this binder bound whose bound state the watch has not shown
        # yet, the known pods that carry terms (by uid; none: nothing to resolve), a count of changes to where
        # pods are (a queued gang's node lists resolved at an older count are looked at again), and the gangs
        # that wait for a pod to be placed or to leave
        self.assumed: dict[PodKey, str] = {}
        self.affine_pods: set[str] = set()  # other schedulers' pods with terms too (by uid, in `other_pods`)
        # the known pods with preferred pod (anti-)affinity terms (by uid): they score the nodes of pods they select
        self.scoring_pods: set[str] = set()
        # other schedulers' bound pods by uid (KUMIKI_BINDER_OTHER_PODS; None: not watched), with terms or not
        self.other_pods: dict[str, core.Placed] | None = {} if other_pods else None
        self.placed_changes = 0
        self.waiting_for_pods: set[str] = set()

    # ---- background tasks -----------------------------------------------------------------------------
    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("binder task failed", exc_info=task.exception())
            self.wake.set()

    def placed(self, pods: list[Pod]) -> list[core.Placed]:
        """The placed pods (on a node or being bound to one, not ended) that `pods`' pod affinity, topology
        spread and preferences are resolved against: every one when one of `pods` has terms or constraints that
        count other pods, else only those with terms (symmetry), found through `affine_pods` and `scoring_pods`
        without a walk over every pod."""
        every = any(counts_other_pods(pod) for pod in pods)
        if every:
            candidates: Iterable[Pod] = (pod for gang in self.gangs.values() for pod in gang.pods.values())
        else:
            candidates = (
                pod for uid in self.affine_pods | self.scoring_pods if (pod := self._known_pods.get(uid)) is not None
            )
        out: list[core.Placed] = []
        for pod in candidates:
            node = pod.node or self.assumed.get(pod.key, "")
            if node and not pod.ended:
                out.append(
                    core.Placed(
                        str(pod.key), pod.key.namespace, pod.labels, node, pod.affinity, pod.preferences.pod_terms
                    )
                )
        if self.other_pods:
            out.extend(other for other in self.other_pods.values() if every or other.terms or other.preferred)
        return out

    def affinity(self, pod: Pod, placed: list[core.Placed], gang: list[Pod]) -> core.AffinityFilter:
        """`pod`'s pod affinity and topology spread against the placed pods; `gang`: the pods placed with it
        (itself may be there)."""
        peers = [(other.key.namespace, other.labels) for other in gang if other.key != pod.key]
        return core.pod_filter(pod, placed, self.nodes, peers)

    def restrict_waiting(self, namespace: str, terms: Iterable[core.PodAffinityTerm]) -> None:
        """A pod of `namespace` with these terms was placed: its anti-affinity keeps the pods it selects out of its
        domain (symmetry), so a gang queued in Placement with lists resolved before, that nothing shaped then,
        is resolved again at the next round if the pod selects one of its pods."""
        anti = [term for term in terms if term.anti]
        if not anti:
            return
        for gang in self.gangs.values():
            queued = gang.submitted and not gang.bound and gang.released != gang.generation
            if not queued or gang.affinity_choices is not None:
                continue  # not waiting in Placement, or its lists are looked at again anyway
            if any(term.selects(namespace, pod.key.namespace, pod.labels) for pod in gang.waiting() for term in anti):
                gang.affinity_choices = ()  # differs from any lists it resolves to: submitted again with them

    def pods_moved(self) -> None:
        """A pod was placed, or left a node: node lists resolved before are stale, and the gangs that waited
        for such a change look again."""
        self.placed_changes += 1
        for job_id in self.waiting_for_pods:
            self.retry_at.pop(job_id, None)
            self.dirty.add(job_id)
        self.waiting_for_pods.clear()
        self.wake.set()

    def touch(self, job_id: str) -> None:
        """The gang changed: look at it in the next round."""
        self.dirty.add(job_id)
        self.wake.set()

    async def _release(self, job_id: str, generation: int, reason: str, state: int) -> None:
        for attempt in range(20):
            try:
                await self.placement.release(job_id, generation, reason, state)
                return
            except Exception as error:  # Placement restarting: try again, the release is idempotent
                log.warning("release failed; retrying", extra={"job": job_id, "reason": str(error)})
                await asyncio.sleep(min(5.0, 0.2 * (attempt + 1)))

    async def _publish_nodes(self, names: list[str], force: bool = False) -> None:
        records = []
        for name in names:
            node = self.nodes.get(name)
            if node is None:
                continue
            state = convert.node_state(node, self.telemetry.get(name))
            previous = self.published.get(name)
            if not force and previous is not None and convert.same_node_state(previous, state):
                continue
            state.last_seen.CopyFrom(timestamp())
            self.published[name] = state
            records.append((name, state))
        if records:
            await self.producer.publish_many(CLUSTER_STATE, records)

    # ---- Kubernetes Events ----------------------------------------------------------------------------
    def _event(
        self,
        kind: str,
        api: str,
        namespace: str,
        name: str,
        uid: str,
        reason: str,
        message: str,
        type_: str = "Warning",
    ) -> None:
        async def send() -> None:
            await self.kube.event(kind, api, namespace, name, uid, reason, message, type_)

        try:
            self.events.put_nowait(send)
        except asyncio.QueueFull:
            EVENTS_DROPPED.inc()

    async def run_events(self, stopping: asyncio.Event, workers: int = 4) -> None:
        """Events are best effort and never slow a Binding: while Bindings are being created one worker sends
        one Event every `busy_event_interval_s`; when none are, every worker sends."""

        async def worker(first: bool) -> None:
            while not stopping.is_set():
                if not first:
                    await self.quiet.wait()
                send = await self.events.get()
                await send()
                if first and not self.quiet.is_set():
                    await asyncio.sleep(self.busy_event_interval_s)

        await asyncio.gather(*(worker(index == 0) for index in range(workers)))
