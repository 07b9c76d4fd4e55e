"""The binder's control loop: API objects in (pods, nodes, PodGroups), Placement's answers and log in,
Bindings, conditions, Events, node records, lifecycle events and evictions out.

State lives in memory and is rebuilt at start from the API (list, then watch from the list's version) and
from Placement's log (`job.lifecycle`, read to its end): a restarted binder finds every gang where it was,
binds what Placement bound but the API never got, and submits again (same generation) what was waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Gauge, Histogram

from kumiki.binder import core
from kumiki.binder.adapters import convert
from kumiki.binder.adapters.kube import KubeApi
from kumiki.binder.adapters.placement import PlacementClient, PlacementUnavailable
from kumiki.binder.core import Gang, Pod, PodKey
from kumiki.common import requests
from kumiki.common.bus import Event, EventProducer
from kumiki.common.bus.topics import CLUSTER_STATE, JOB_LIFECYCLE
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2
from kumiki.common.grpcutil import timestamp
from kumiki.common.tracing import extract_context, recording
from kumiki.sched.jobs import PodRequest

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.binder")

BINDS = Counter("kumiki_binder_pods_bound_total", "Pods the binder bound (Binding created)")
GANGS = Counter("kumiki_binder_gangs_total", "Gang submissions by Placement's answer", ["outcome"])
BIND_SECONDS = Histogram(
    "kumiki_binder_gang_bind_seconds",
    "From submitting a gang to the last of its Bindings",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
POD_SCHEDULING_SECONDS = Histogram(
    "kumiki_binder_pod_scheduling_seconds",
    "End-to-end pod scheduling latency: the pod's creationTimestamp (whole seconds) to its Binding created",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
EVICTIONS = Counter("kumiki_binder_evictions_total", "Eviction API calls by result", ["result"])
EVICTIONS_CONFIRMED = Counter(
    "kumiki_binder_evictions_confirmed_total", "Generations the preemption coordinator released as PREEMPTED"
)
REPAIRS = Counter("kumiki_binder_repaired_binds_total", "Binds Placement made that the API had not got, repaired")
PENDING = Gauge("kumiki_binder_pending_pods", "Pods with schedulerName kumiki and no node")
EVENTS_DROPPED = Counter("kumiki_binder_events_dropped_total", "Kubernetes Events not sent (queue full)")

BINDER_SOURCE_PREFIX = "//kumiki/binder/"


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


class Binder:
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
        self.told_late: set[str] = set()
        self.never_fit: set[str] = set()
        self.settle_s = settle_s
        self._known_pods: dict[str, Pod] = {}  # by uid: a pod's spec is immutable, its request read once
        self.capacity: core.ClusterCapacity | None = None  # the largest node shapes (never_fits), None: stale
        self.binding = 0  # gangs whose Bindings are being created now (Events wait behind them)
        self.quiet = asyncio.Event()  # set while no Bindings are being created
        self.quiet.set()
        self.busy_event_interval_s = busy_event_interval_s

    # ---- Placement's log ------------------------------------------------------------------------------
    async def on_lifecycle(self, key: str, event: Event | None) -> None:
        """job.lifecycle: remember each job's last generation and state; a BOUND for a gang that waits
        (the scheduling cycle placed it later) binds its pods."""
        if event is None:
            return
        message = event.payload
        assert isinstance(message, events_pb2.JobLifecycle)
        if message.state not in (
            events_pb2.JOB_STATE_SUBMITTED,
            events_pb2.JOB_STATE_BOUND,
            events_pb2.JOB_STATE_RELEASED,
            events_pb2.JOB_STATE_COMPLETED,
            events_pb2.JOB_STATE_FAILED,
            events_pb2.JOB_STATE_PREEMPTED,
        ):
            return
        job_id = message.job.job_id
        current = self.logged.get(job_id)
        if current is not None and message.job.generation < current.generation:
            return
        self.logged[job_id] = LoggedJob(
            message.job.generation,
            message.state,
            convert.pod_assignments(message.assignments),
            [convert.pod_request(pod) for pod in message.pods],
        )
        if message.state == events_pb2.JOB_STATE_PREEMPTED:
            self._evicted(job_id, message.job.generation)
        if not self.synced.is_set() or message.state != events_pb2.JOB_STATE_BOUND:
            return
        gang = self.gangs.get(job_id)
        if (
            gang is not None
            and gang.generation == message.job.generation
            and not gang.bound
            and job_id not in self.busy
        ):
            self._spawn(
                self._apply_traced(
                    gang,
                    message.job.generation,
                    convert.pod_assignments(message.assignments),
                    "cycle",
                    extract_context(event.headers),
                )
            )

    async def _apply_traced(
        self,
        gang: Gang,
        generation: int,
        placed: list[core.PodAssignment],
        how: str,
        parent: otel_context.Context,
    ) -> None:
        """A bind Placement decided without the binder asking (its scheduling pass): the gang's span continues
        the pass's trace, from the traceparent its BOUND event carried, so a later bind (or a rebind after a
        preemption) is in the trace of the decision that made it. No context and no exporter: no span."""
        if not recording() and not trace.get_current_span(parent).get_span_context().is_valid:
            await self._apply(gang, generation, placed, how)
            return
        attributes = gang_attributes(gang, generation, len(placed), how)
        with tracer.start_as_current_span("reconcile pod group", context=parent, attributes=attributes):
            await self._apply(gang, generation, placed, how)

    # ---- cluster.state (telemetry's view) ----------------------------------------------------------------
    async def on_cluster_state(self, key: str, event: Event | None) -> None:
        if event is None:
            self.telemetry.pop(key, None)
            return
        if event.attributes.source.startswith(BINDER_SOURCE_PREFIX):
            return  # our own record
        state = event.payload
        assert isinstance(state, events_pb2.NodeState)
        self.telemetry[key] = state
        if key in self.nodes:
            await self._publish_nodes([key], force=True)  # telemetry's record must not undo a cordon

    # ---- nodes ----------------------------------------------------------------------------------------
    async def on_node(self, kind: str, obj: dict[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            self.nodes.pop(name, None)
            self.published.pop(name, None)
            self.capacity = None
            await self.producer.publish(CLUSTER_STATE, name, events_pb2.NodeState(node=name, healthy=False))
            self._nodes_changed()
            return
        before = self.nodes.get(name)
        node = core.parse_node(obj)
        self.nodes[name] = node
        self.node_changes += 1
        await self._publish_nodes([name])
        if before is None or core.capacity_changed(before, node):
            self.capacity = None
        if before is None or core.capacity_changed(before, node) or before.labels != node.labels:
            self._nodes_changed()  # more room, a lifted taint or a new label: what never fitted may now

    def _nodes_changed(self) -> None:
        """A pod that never fitted may fit now: look at those gangs again at once."""
        for job_id in self.never_fit:
            self.retry_at.pop(job_id, None)
            self.dirty.add(job_id)
        self.never_fit.clear()
        self.wake.set()

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

    # ---- PodGroups ------------------------------------------------------------------------------------
    async def on_podgroup(self, kind: str, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        key = (str(metadata.get("namespace") or "default"), str(metadata.get("name") or ""))
        if kind == "DELETED":
            self.min_members.pop(key, None)
            self.timeouts.pop(key, None)
            return
        spec = obj.get("spec") or {}
        try:
            minimum = max(0, int(spec.get("minMember") or 0))
        except (TypeError, ValueError):
            minimum = 0
        self.min_members[key] = (minimum, str(metadata.get("uid") or ""))
        timeout = spec.get("scheduleTimeoutSeconds")
        timeout_s = timeout if isinstance(timeout, int) and not isinstance(timeout, bool) and timeout > 0 else 0
        if timeout is not None and not timeout_s:
            log.warning(
                "PodGroup scheduleTimeoutSeconds ignored: expected a positive integer",
                extra={"podgroup": f"{key[0]}/{key[1]}", "value": repr(timeout)},
            )
        self.timeouts[key] = timeout_s
        gang = self.gangs.get(core.job_id_for(key[0], key[1], ""))
        if gang is not None:
            if gang.min_member != minimum or gang.timeout_s != timeout_s:
                gang.timed_out = False  # the group's terms changed: it may try again
            gang.min_member = minimum
            gang.timeout_s = timeout_s
            self.touch(gang.job_id)

    # ---- pods -----------------------------------------------------------------------------------------
    def _evicted(self, job_id: str, generation: int) -> None:
        """The coordinator released this generation as PREEMPTED: the group's next pods (its job controller makes
        them, resuming from the checkpoint) are the next generation, not late members of a placed gang."""
        if self.synced.is_set():  # not the log's history read again at start
            EVICTIONS_CONFIRMED.inc()
        if self.evicting.get(job_id, 0) <= generation:
            self.evicting.pop(job_id, None)  # the eviction is over: the next generation's pods are watched again
        gang = self.gangs.get(job_id)
        if gang is None or gang.generation != generation or not gang.bound:
            return
        gang.bound = False
        gang.released = generation
        gang.submitted = ()
        gang.waiting_since = 0.0
        self.told_late.discard(job_id)
        if not any(not pod.deleting and not pod.ended for pod in gang.pods.values()):
            self.gangs.pop(job_id, None)
        self.touch(job_id)

    def _gang_for(self, pod: Pod) -> Gang:
        job_id = pod.job_id
        gang = self.gangs.get(job_id)
        if gang is None:
            gang = Gang(job_id=job_id, namespace=pod.key.namespace, group=pod.group)
            minimum = self.min_members.get((pod.key.namespace, pod.group)) if pod.group else None
            if minimum is not None:
                gang.min_member = minimum[0]
                gang.timeout_s = self.timeouts.get((pod.key.namespace, pod.group), 0)
            logged = self.logged.get(job_id)
            if logged is not None:
                gang.generation = logged.generation
            self.gangs[job_id] = gang
        return gang

    async def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        known = self._known_pods.get(str((obj.get("metadata") or {}).get("uid") or ""))
        pod = core.parse_pod(obj, known)
        if kind == "DELETED":
            self._known_pods.pop(pod.uid, None)
        elif pod.uid:
            self._known_pods[pod.uid] = pod
        gang = self._gang_for(pod)
        if kind == "DELETED":
            gang.pods.pop(pod.key, None)
            gang.timed_out = False
            self.touch(gang.job_id)
            await self._check_progress(gang)
            waiting_in_placement = gang.generation and not gang.bound and gang.released != gang.generation
            if waiting_in_placement and not gang.waiting() and gang.submitted:
                gang.released = gang.generation  # its pods are gone: withdraw it from Placement's queue
                self._spawn(self._release(gang.job_id, gang.generation, "pods deleted while waiting", 0))
            if not gang.pods and (not gang.bound or gang.released == gang.generation):
                self.gangs.pop(gang.job_id, None)
            return
        previous = gang.pods.get(pod.key)
        gang.pods[pod.key] = pod
        if not pod.node:
            if previous is None:
                gang.last_join = time.monotonic()
                gang.timed_out = False
            if previous is None or previous.node != pod.node:
                self.touch(gang.job_id)
            return
        if pod.generation_annotation and pod.job_annotation == gang.job_id and not gang.bound:
            # bound by an earlier life of the binder (or a replica before it)
            gang.generation = max(gang.generation, pod.generation_annotation)
        if previous is None or previous.phase != pod.phase or previous.node != pod.node:
            await self._check_progress(gang)

    async def _check_progress(self, gang: Gang) -> None:
        """RUNNING once every bound pod runs; COMPLETED / FAILED (Release in Placement) once all ended."""
        if not gang.bound or gang.released == gang.generation or self.evicting.get(gang.job_id) == gang.generation:
            return
        members = [gang.pods.get(key) for key in gang.submitted]
        present = [pod for pod in members if pod is not None]
        deleted = len(present) < len(members)
        if not deleted and present and all(pod.phase == "Running" for pod in present):
            if gang.running_published != gang.generation:
                gang.running_published = gang.generation
                self._spawn(self._publish_running(gang, present))  # never hold the pod watch on the broker
            return
        outcome = core.gang_outcome(present)
        if outcome is None and not (deleted and all(pod.ended for pod in present)):
            return
        state: int = convert.job_state(outcome)
        if deleted and outcome is None:
            state, reason = events_pb2.JOB_STATE_RELEASED, "pods deleted"
        else:
            reason = "pods succeeded" if outcome == "completed" else "a pod failed"
        gang.released = gang.generation
        self._spawn(self._release(gang.job_id, gang.generation, reason, state))
        if gang.group and state != events_pb2.JOB_STATE_RELEASED:
            phase = "Succeeded" if state == events_pb2.JOB_STATE_COMPLETED else "Failed"
            self._spawn(self.kube.set_podgroup_phase(gang.namespace, gang.group, phase, len(members), 0))

    async def _release(self, job_id: str, generation: int, reason: str, state: int) -> None:
        for attempt in range(20):
            try:
                await self.placement.release(job_id, generation, reason, state)
                return
            except Exception as error:  # Placement restarting: try again, the release is idempotent
                log.warning("release failed; retrying", extra={"job": job_id, "reason": str(error)})
                await asyncio.sleep(min(5.0, 0.2 * (attempt + 1)))

    async def _publish_running(self, gang: Gang, pods: list[Pod]) -> None:
        first = pods[0]
        message = events_pb2.JobLifecycle(
            job=common_pb2.JobRef(job_id=gang.job_id, generation=gang.generation),
            state=events_pb2.JOB_STATE_RUNNING,
            at=timestamp(),
            queue=first.queue,
            priority_tier=first.priority,
            preemptible=first.preemptible,
            pods=[requests.pod_resources(pod.resources) for pod in pods if pod.resources is not None],
            gpus=sum(
                (pod.resources.gpus or pod.resources.gpu_fraction or (1.0 if pod.resources.mig_profile else 0.0))
                for pod in pods
                if pod.resources is not None
            ),
            name=gang.group or first.key.name,
            reason=f"{len(pods)} pod(s) running",
        )
        await self.producer.publish(
            JOB_LIFECYCLE, gang.job_id, message, event_id=f"{gang.job_id}/{gang.generation}/running"
        )
        if gang.group:
            await self.kube.set_podgroup_phase(gang.namespace, gang.group, "Running", len(pods), len(pods))

    # ---- submitting -----------------------------------------------------------------------------------
    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("binder task failed", exc_info=task.exception())
            self.wake.set()

    def touch(self, job_id: str) -> None:
        """The gang changed: look at it in the next round."""
        self.dirty.add(job_id)
        self.wake.set()

    async def run_submissions(self, stopping: asyncio.Event) -> None:
        """Each round: every changed gang that is complete and not in flight goes to Placement. A sweep a
        quarter of a second looks at every gang again (retries, groups that settled, the pending gauge)."""
        await self.synced.wait()
        self.dirty.update(self.gangs)
        last_sweep = 0.0
        while not stopping.is_set():
            self.wake.clear()
            now = time.monotonic()
            if now - last_sweep >= 0.25:
                last_sweep = now
                # a bound gang changes only when its pods do (touch): the sweep is for the ones that wait
                waiting = [job_id for job_id, gang in self.gangs.items() if not gang.bound]
                self.dirty.update(waiting)
                PENDING.set(sum(gang.waiting_count() for gang in self.gangs.values()))
            dirty, self.dirty = self.dirty, set()
            gangs = sorted(
                (gang for job_id in dirty if (gang := self.gangs.get(job_id)) is not None),
                key=lambda gang: gang.submit_order(),
            )
            for gang in gangs:
                job_id = gang.job_id
                if job_id in self.busy or self.retry_at.get(job_id, 0.0) > now or gang.timed_out:
                    continue
                if (
                    gang.timeout_s
                    and gang.waiting_since
                    and not gang.bound
                    and now - gang.waiting_since > gang.timeout_s
                ):
                    self.busy.add(job_id)
                    self._spawn(self._time_out(gang, now - gang.waiting_since))
                    continue
                if gang.bound and gang.released != gang.generation:
                    late = [pod for pod in gang.waiting() if pod.key not in gang.submitted]
                    if late and job_id not in self.told_late:
                        self.told_late.add(job_id)
                        self._spawn(
                            self._tell_pending(
                                gang, late, "GroupAlreadyPlaced", "the pod group was placed before this pod joined it"
                            )
                        )
                    continue
                if not gang.ready_to_submit():
                    continue
                waiting_keys = tuple(pod.key for pod in gang.waiting())
                if gang.generation and gang.released != gang.generation and gang.submitted == waiting_keys:
                    logged = self.logged.get(job_id)
                    if logged and logged.state == events_pb2.JOB_STATE_BOUND and logged.generation == gang.generation:
                        # bound by the cycle while our submission was in flight (its event found us busy)
                        self.busy.add(job_id)
                        self._spawn(self._apply(gang, gang.generation, list(logged.assignments), "cycle"))
                    continue  # queued in Placement as it is: its bind arrives on job.lifecycle
                if gang.group and not gang.min_member and now - gang.last_join < self.settle_s:
                    continue  # a group without a PodGroup: wait until its pods stop arriving
                self.busy.add(job_id)
                self._spawn(self._submit(gang))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=0.25)

    def reconcile(self) -> None:
        """After the first list: gangs whose pods are bound resume where they were; a gang Placement bound
        (its last word in the log) whose pods are not all bound is repaired exactly as logged."""
        for gang in self.gangs.values():
            logged = self.logged.get(gang.job_id)
            members = sorted((pod for pod in gang.pods.values() if not pod.deleting), key=lambda pod: pod.key.name)
            bound = [pod for pod in members if pod.node]
            if not bound:
                continue
            generation = max(pod.generation_annotation for pod in bound) or (logged.generation if logged else 1)
            gang.generation = generation
            if len(bound) == len(members):
                gang.bound = True
                gang.submitted = tuple(pod.key for pod in members)
                if (
                    logged is not None
                    and logged.generation == generation
                    and logged.state != events_pb2.JOB_STATE_BOUND
                ):
                    gang.released = generation  # Placement already released it (it ended while we were away)
                continue
            if (
                logged is not None
                and logged.state == events_pb2.JOB_STATE_BOUND
                and logged.generation == generation
                and core.same_requests(logged.pods, [pod.resources for pod in members])
            ):
                gang.submitted = tuple(pod.key for pod in members)
                self.busy.add(gang.job_id)
                self._spawn(self._apply(gang, generation, list(logged.assignments), "repair"))
                continue
            log.warning("a partly bound gang cannot be repaired as logged", extra={"job": gang.job_id})
            gang.bound = True
            gang.submitted = tuple(pod.key for pod in bound)

    async def _submit(self, gang: Gang) -> None:
        try:
            async with self.slots:
                await self._submit_now(gang)
        finally:
            self.busy.discard(gang.job_id)

    async def _submit_now(self, gang: Gang) -> None:
        pods = gang.waiting()
        if not pods:
            return
        invalid = [pod for pod in pods if pod.invalid]
        if invalid:
            await self._tell_pending(gang, pods, "InvalidRequest", f"{invalid[0].key.name}: {invalid[0].invalid}")
            self.retry_at[gang.job_id] = time.monotonic() + 3600  # a pod's request does not change
            return
        if self.capacity is None:
            self.capacity = core.ClusterCapacity.of(node for node in self.nodes.values() if node.schedulable)
        for pod in pods:
            assert pod.resources is not None
            why = self.capacity.never_fits(pod.resources)
            if why:
                await self._tell_pending(gang, pods, "NeverFits", f"no node in the cluster could ever hold it: {why}")
                self.retry_at[gang.job_id] = time.monotonic() + 30  # look again then, or when nodes change
                self.never_fit.add(gang.job_id)
                return
        candidates = [node for node in self.nodes.values() if node.schedulable]
        choices = [core.node_choice(pod.rules, candidates, self.capacity.tainted) for pod in pods]
        for pod, choice in zip(pods, choices, strict=True):
            if choice.none_because:
                message = f"{pod.key.name}: {choice.none_because} (nodeSelector, node affinity, tolerations)"
                await self._tell_pending(gang, pods, "NeverFits", message)
                self.retry_at[gang.job_id] = time.monotonic() + 30  # look again then, or when nodes change
                self.never_fit.add(gang.job_id)
                return
        generation = self._generation_for(gang, pods)
        if generation is None:
            return
        if not gang.waiting_since:
            gang.waiting_since = time.monotonic()  # scheduleTimeoutSeconds counts from the first submission
        request = placement_pb2.BindRequest(job=common_pb2.JobRef(job_id=gang.job_id, generation=generation))
        fields = core.bind_request_fields(gang, pods)
        request.queue = fields["queue"]
        request.pods.extend(
            requests.pod_resources(core.with_choice(resources, choice))
            for resources, choice in zip(fields["pods"], choices, strict=True)
        )
        request.min_members = fields["min_members"]
        request.topology.CopyFrom(convert.topology_constraint(fields["topology"]))
        request.priority_tier = fields["priority_tier"]
        request.preemptible = fields["preemptible"]
        request.name = fields["name"]
        request.image = fields["image"]
        request.command = fields["command"]
        if "time_limit_s" in fields:  # proto3 optional: left unset when no pod asks for a limit
            request.time_limit_s = fields["time_limit_s"]
        if generation != gang.generation or gang.released == generation:
            gang.bound = False
            gang.running_published = 0
        gang.generation = generation
        gang.submitted = tuple(pod.key for pod in pods)
        started = time.perf_counter()
        with tracer.start_as_current_span(
            "reconcile pod group", attributes=gang_attributes(gang, generation, len(pods), "submit")
        ) as span:
            try:
                answer = await self.placement.bind(request)
            except PlacementUnavailable as error:
                log.warning(
                    "placement unavailable; the gang goes again", extra={"job": gang.job_id, "reason": str(error)}
                )
                gang.submitted = ()
                self.retry_at[gang.job_id] = time.monotonic() + 1.0
                return
            if answer.status_code:
                gang.submitted = ()
                GANGS.labels("refused").inc()
                span.set_attribute("kumiki.refused", answer.error)
                if answer.status_code == 9:  # FAILED_PRECONDITION: an older generation still holds GPUs
                    await self._resolve_conflict(gang)
                else:
                    await self._tell_pending(gang, pods, "PlacementRefused", answer.error)
                    self.retry_at[gang.job_id] = time.monotonic() + 5.0
                return
            response = answer.response
            if response.outcome == placement_pb2.BindResponse.OUTCOME_BOUND:
                GANGS.labels("bound").inc()
                span.set_attribute("kumiki.outcome", "bound")
                await self._apply(gang, generation, convert.pod_assignments(response.assignments), "answer")
                BIND_SECONDS.observe(time.perf_counter() - started)
                return
            GANGS.labels("pending").inc()
            span.set_attribute("kumiki.outcome", "pending")
            reason, message = core.reason_text(convert.pending_reason(reason) for reason in response.reasons)
            ruled = [choice for choice in choices if choice.nodes or choice.avoid]
            if ruled:  # Placement looked only at the nodes the rules admit: say so, the cluster may have room
                admitted = len(ruled[0].nodes) or len(candidates) - len(ruled[0].avoid)
                message += f" (on the {admitted} of {len(candidates)} nodes its node rules admit)"
            await self._tell_pending(gang, pods, reason, message)

    def _generation_for(self, gang: Gang, pods: list[Pod]) -> int | None:
        """The generation to submit: the logged one again while it waits with the same pods (Placement answers
        it as before), the next one once it was released, ended, or asked for different pods."""
        logged = self.logged.get(gang.job_id)
        last = max(gang.generation, logged.generation if logged else 0)
        if last == 0:
            return 1
        if logged is not None and logged.generation == last:
            if logged.state == events_pb2.JOB_STATE_SUBMITTED and core.same_requests(
                logged.pods, [pod.resources for pod in pods]
            ):
                return last
            if logged.state == events_pb2.JOB_STATE_BOUND:
                if gang.released == last or gang.bound:
                    return last + 1
                # Placement bound it but the API never got the bind (the binder died in between): repair
                if core.same_requests(logged.pods, [pod.resources for pod in pods]):
                    self._spawn(self._apply(gang, last, list(logged.assignments), "repair"))
                    gang.generation = last
                    gang.submitted = tuple(pod.key for pod in pods)
                    return None
                self._spawn(self._release(gang.job_id, last, "pods changed before they were bound", 0))
                return last + 1
            if logged.state == events_pb2.JOB_STATE_SUBMITTED:
                self._spawn(self._release(gang.job_id, last, "pods changed while waiting", 0))
            return last + 1
        if gang.submitted == tuple(pod.key for pod in pods) and not gang.bound:
            return last  # our own pending submission again (same pods)
        return last + 1

    async def _resolve_conflict(self, gang: Gang) -> None:
        """Placement holds an older generation for this job: release it (its pods are gone) and go again."""
        logged = self.logged.get(gang.job_id)
        if logged is not None and logged.state == events_pb2.JOB_STATE_BOUND:
            await self._release(gang.job_id, logged.generation, "superseded by a new generation of the pods", 0)
            logged.state = events_pb2.JOB_STATE_RELEASED
        self.retry_at[gang.job_id] = time.monotonic() + 0.5
        self.touch(gang.job_id)

    async def _tell_pending(
        self, gang: Gang, pods: list[Pod], reason: str, message: str, phase: str = "Pending"
    ) -> None:
        """PodScheduled=False with the reason, an Event on each pod and on the PodGroup (when it changed)."""
        text = f"{reason}: {message}"
        if gang.reason == text:
            return
        gang.reason = text
        await asyncio.gather(
            *(self.kube.set_unschedulable(pod.key.namespace, pod.key.name, reason, message) for pod in pods)
        )
        for pod in pods:
            self._event("Pod", "v1", pod.key.namespace, pod.key.name, pod.uid, "FailedScheduling", text)
        if gang.group:
            uid = self.min_members.get((gang.namespace, gang.group), (0, ""))[1]
            if uid:
                self._event(
                    "PodGroup", "scheduling.x-k8s.io/v1alpha1", gang.namespace, gang.group, uid, "Unschedulable", text
                )
                await self.kube.set_podgroup_phase(gang.namespace, gang.group, phase, 0, 0)

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

    # ---- binding --------------------------------------------------------------------------------------
    async def _apply(self, gang: Gang, generation: int, placed: list[core.PodAssignment], how: str) -> None:
        """Create each pod's Binding as Placement assigned it; a node the API no longer has schedulable sends
        the gang back (released, then submitted again with the next generation)."""
        if gang.bound and gang.generation == generation:
            return
        self.busy.add(gang.job_id)
        try:
            for assignment in placed:
                node = self.nodes.get(assignment.node)
                member = self._member(gang, assignment.pod_index)
                refused = node.why_not or (member.rules.why_not(node) if member is not None else "") if node else ""
                if node is None or refused:
                    why = "gone" if node is None else refused
                    log.warning(
                        "assigned node not schedulable; the gang goes again",
                        extra={"job": gang.job_id, "node": assignment.node, "why": why},
                    )
                    await self._release(gang.job_id, generation, f"node {assignment.node} {why} before the bind", 0)
                    gang.generation = generation
                    gang.released = generation
                    self.retry_at[gang.job_id] = time.monotonic() + 0.2
                    await self._publish_nodes([assignment.node], force=True)
                    return
            gang.generation = generation
            gang.bound = True
            gang.reason = ""
            gang.waiting_since = 0.0
            self.binding += 1
            self.quiet.clear()

            async def bind_one(assignment: core.PodAssignment) -> bool:
                key = gang.submitted[assignment.pod_index]
                pod = gang.pods.get(key)
                if pod is None:
                    return False
                if pod.node:
                    return pod.node == assignment.node
                annotations = core.assignment_annotations(
                    gang.job_id, generation, assignment, self.nodes.get(assignment.node)
                )
                done = await self.kube.bind(key.namespace, key.name, pod.uid, assignment.node, annotations)
                if done:
                    BINDS.inc()
                    if pod.created_unix_s:  # queueing, gang wait and Placement included: what a user waits
                        POD_SCHEDULING_SECONDS.observe(max(0.0, time.time() - pod.created_unix_s))
                    if how == "repair":
                        REPAIRS.inc()
                    if self.scheduled_events:
                        self._event(
                            "Pod",
                            "v1",
                            key.namespace,
                            key.name,
                            pod.uid,
                            "Scheduled",
                            f"Successfully assigned {key} to {assignment.node} ({how})",
                            "Normal",
                        )
                return done

            try:
                results = await asyncio.gather(*(bind_one(assignment) for assignment in placed), return_exceptions=True)
            finally:
                self.binding -= 1
                if not self.binding:
                    self.quiet.set()
            failures = [result for result in results if isinstance(result, BaseException)]
            if failures:
                log.error("bindings failed; retrying the gang", extra={"job": gang.job_id, "reason": str(failures[0])})
                gang.bound = False
                self.retry_at[gang.job_id] = time.monotonic() + 1.0
                self._spawn(self._retry_apply(gang, generation, placed, how))
                return
            if gang.group:
                await self.kube.set_podgroup_phase(gang.namespace, gang.group, "Scheduled", len(placed), 0)
        finally:
            self.busy.discard(gang.job_id)

    def _member(self, gang: Gang, index: int) -> Pod | None:
        if 0 <= index < len(gang.submitted):
            return gang.pods.get(gang.submitted[index])
        return None

    async def _time_out(self, gang: Gang, waited_s: float) -> None:
        """PodGroup scheduleTimeoutSeconds passed with the gang unplaced: it leaves Placement's queue (it holds
        no place, no reservation, nothing the gangs behind it wait for), its pods and PodGroup say so, and the
        PodGroup's phase is Failed. It tries again when its pods or its PodGroup change."""
        try:
            gang.timed_out = True
            log.info("pod group past its scheduleTimeoutSeconds", extra={"job": gang.job_id, "waited_s": waited_s})
            if gang.generation and gang.submitted and gang.released != gang.generation:
                gang.released = gang.generation
                await self._release(gang.job_id, gang.generation, "scheduleTimeoutSeconds passed", 0)
            pods = gang.waiting()
            last = gang.reason or "waiting for placement"
            gang.reason = ""
            message = (
                f"the pod group waited {waited_s:.0f}s, past its scheduleTimeoutSeconds ({gang.timeout_s}), "
                f"without fitting; it tries again when its pods or PodGroup change. Last: {last}"
            )
            await self._tell_pending(gang, pods, "ScheduleTimeout", message, phase="Failed")
            gang.waiting_since = 0.0
        finally:
            self.busy.discard(gang.job_id)

    async def _retry_apply(self, gang: Gang, generation: int, placed: list[core.PodAssignment], how: str) -> None:
        await asyncio.sleep(1.0)
        await self._apply(gang, generation, placed, how)

    # ---- eviction -------------------------------------------------------------------------------------
    async def on_preemption(self, event: Event, connection: object = None) -> None:
        command = event.payload
        assert isinstance(command, events_pb2.PreemptionCommand)
        if command.action != events_pb2.PREEMPTION_ACTION_EVICT:
            return  # CHECKPOINT goes to the job's SDK, RESUME is the job's own restart
        job_id, generation = command.job.job_id, command.job.generation
        logged = self.logged.get(job_id)
        released = logged is not None and (
            logged.generation > generation
            or (logged.generation == generation and logged.state == events_pb2.JOB_STATE_PREEMPTED)
        )
        if not released:
            self.evicting[job_id] = generation
        self._spawn(self.evict(job_id, command.grace_period_s, command.reason or "preempted", generation=generation))

    async def evict(
        self, job_id: str, grace_period_s: float, reason: str, attempts: int = 60, generation: int = 0
    ) -> bool:
        """Evict every pod of the job (of `generation` and before, when given: a late command never takes a later
        generation's pods) through the Eviction API; a refusal (a PodDisruptionBudget) is retried with backoff
        and reported on the pod; never a plain delete. True when every pod was evicted."""
        gang = self.gangs.get(job_id)
        if gang is None:
            return True
        # under the command's `process` span: the eviction is in the preemption's trace
        with tracer.start_as_current_span(
            "evict pod group",
            attributes={
                **gang_attributes(gang, gang.generation, len(gang.pods), "preemption"),
                "kumiki.reason": reason,
            },
        ) as span:
            evicted = await self._evict(gang, grace_period_s, reason, attempts, generation)
            span.set_attribute("kumiki.evicted", evicted)
            return evicted

    async def _evict(self, gang: Gang, grace_period_s: float, reason: str, attempts: int, generation: int) -> bool:
        job_id = gang.job_id
        remaining = sorted(
            (
                key
                for key, pod in gang.pods.items()
                if pod.node and not pod.ended and (not generation or pod.generation_annotation <= generation)
            ),
            key=str,
        )
        for attempt in range(attempts):
            still: list[PodKey] = []
            for key in remaining:
                accepted, why = await self.kube.evict(key.namespace, key.name, grace_period_s)
                EVICTIONS.labels("accepted" if accepted else "refused").inc()
                if not accepted:
                    still.append(key)
                    pod = gang.pods.get(key)
                    log.warning(
                        "eviction refused; retrying", extra={"pod": str(key), "reason": why, "attempt": attempt}
                    )
                    self._event(
                        "Pod",
                        "v1",
                        key.namespace,
                        key.name,
                        pod.uid if pod else "",
                        "EvictionRefused",
                        f"{reason}: {why}",
                    )
            if not still:
                return True
            remaining = still
            await asyncio.sleep(min(10.0, 0.5 * (attempt + 1)))
        log.error("eviction gave up", extra={"job": job_id, "pods": [str(key) for key in remaining]})
        return False
