"""The binder's control loop: API objects in (pods, nodes, PodGroups), Placement's answers and log in,
Bindings, conditions, Events, node records, lifecycle events and evictions out.

State lives in memory and is rebuilt at start from the API (list, then watch from the list's version) and
from Placement's log (`job.lifecycle`, read to its end): a restarted binder finds every gang where it was,
binds what Placement bound but the API never got, and submits again (same generation) what was waiting.

`Binder` is the watch and log handlers; the rest are its mixins, a module each: `state` (what they share),
`binding` (Bindings as Placement assigned), `submission` (the loop that asks Placement) and `eviction`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kumiki.binder import core
from kumiki.binder.adapters import convert
from kumiki.binder.adapters.eviction import Eviction
from kumiki.binder.adapters.state import LoggedJob, gang_attributes
from kumiki.binder.adapters.submission import Submissions
from kumiki.binder.core import Gang, Pod
from kumiki.common import requests
from kumiki.common.bus import Event
from kumiki.common.bus.topics import CLUSTER_STATE, JOB_LIFECYCLE
from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.grpcutil import timestamp
from kumiki.common.tracing import extract_context

__all__ = ["BINDER_SOURCE_PREFIX", "Binder", "LoggedJob", "gang_attributes"]

log = logging.getLogger(__name__)
BINDER_SOURCE_PREFIX = "//kumiki/binder/"


class Binder(Submissions, Eviction):
    """What the API's watches and Placement's log say, applied to the shared state; the mixins act on it."""

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
        elif message.state in (events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED):
            self._attempt_over(job_id, message.job.generation)  # ended on its own: no release of an eviction will come
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
            self.affine_pods.discard(pod.uid)
            self.scoring_pods.discard(pod.uid)
        elif pod.uid:
            self._known_pods[pod.uid] = pod
            if pod.affinity or pod.spread:
                self.affine_pods.add(pod.uid)
            if pod.preferences.pod_terms:
                self.scoring_pods.add(pod.uid)
        self._track_placed(kind, known, pod)
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
            if told := self.told_late.get(gang.job_id):
                told.discard(pod.key)
            if not gang.pods and (not gang.bound or gang.released == gang.generation):
                self.gangs.pop(gang.job_id, None)
                self.told_late.pop(gang.job_id, None)
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

    async def on_other_pod(self, kind: str, obj: dict[str, Any]) -> None:
        """A bound pod of another scheduler (KUMIKI_BINDER_OTHER_PODS): counted by pod affinity and topology
        spread while it has not ended, never scheduled here."""
        assert self.other_pods is not None
        placed = core.placed_pod(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        before = self.other_pods.get(uid)
        if kind == "DELETED" or placed is None:
            self.other_pods.pop(uid, None)
            self.affine_pods.discard(uid)
            self.scoring_pods.discard(uid)
        else:
            self.other_pods[uid] = placed
            # with terms, it restricts or scores the pods it selects (symmetry): resolving lists is needed
            for holds, pods in ((placed.terms, self.affine_pods), (placed.preferred, self.scoring_pods)):
                if holds:
                    pods.add(uid)
                else:
                    pods.discard(uid)
            if before is None:
                self.restrict_waiting(placed.namespace, placed.terms)
        if before != self.other_pods.get(uid):
            self.pods_moved()

    def _track_placed(self, kind: str, known: Pod | None, pod: Pod) -> None:
        """Keep `assumed` to the Bindings the watch has not shown, and count a pod placed, moved, relabelled,
        ended or deleted as a change to where pods are (what pod affinity is resolved against)."""
        before = (known.node or self.assumed.get(known.key, "")) if known is not None and not known.ended else ""
        if kind == "DELETED" or pod.node:
            self.assumed.pop(pod.key, None)
        now = "" if kind == "DELETED" or pod.ended else pod.node or self.assumed.get(pod.key, "")
        if now and not before:  # placed by someone else (another binder replica, an earlier life of this one)
            self.restrict_waiting(pod.key.namespace, pod.affinity)
        if before != now or (now and known is not None and known.labels != pod.labels):
            self.pods_moved()

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
