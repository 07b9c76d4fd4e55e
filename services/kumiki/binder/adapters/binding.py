"""Applying Placement's answer: a Binding per pod as assigned, the gang sent back when a node went away."""

from __future__ import annotations

import asyncio
import logging
import time

from opentelemetry import context as otel_context
from opentelemetry import trace

from kumiki.binder import core
from kumiki.binder.adapters.metrics import BINDS, POD_SCHEDULING_SECONDS, REPAIRS, REPLACEMENTS, SENT_BACK
from kumiki.binder.adapters.state import BinderState, gang_attributes, tracer
from kumiki.binder.core import Gang, Pod, PodKey
from kumiki.common.tracing import recording

log = logging.getLogger(__name__)


class Binding(BinderState):
    """Binds the gangs Placement placed, whether it answered the binder or bound them on its own later."""

    async def _apply(self, gang: Gang, generation: int, placed: list[core.PodAssignment], how: str) -> None:
        """Create each pod's Binding as Placement assigned it; a node the API no longer has schedulable sends
        the gang back (released, then submitted again with the next generation)."""
        if gang.bound and gang.generation == generation:
            return
        self.busy.add(gang.job_id)
        try:
            members = [pod for pod in (self._member(gang, a.pod_index) for a in placed) if pod is not None]
            others = self.placed(members) if self.affine_pods else []  # before any of this gang's is assumed
            for assignment in placed:
                node = self.nodes.get(assignment.node)
                member = self._member(gang, assignment.pod_index)
                refused = node.why_not or (member.rules.why_not(node) if member is not None else "") if node else ""
                barred = ""
                if node is not None and not refused and member is not None and self.affine_pods:
                    # a pod placed since the gang's lists were resolved (or in the same pass) may bar the node
                    barred = refused = self.affinity(member, others, members).why_not(node)
                if node is None or refused:
                    SENT_BACK.labels("pod_affinity" if barred else "node").inc()
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
            for assignment in placed:  # placed from now on for every gang's pod affinity, before any await
                member = self._member(gang, assignment.pod_index)
                if member is not None and not member.node:
                    self.assumed[member.key] = assignment.node
                    self.restrict_waiting(member.key.namespace, member.affinity)
            self.pods_moved()
            gang.waiting_since = 0.0
            self.binding += 1
            self.quiet.clear()

            async def bind_one(assignment: core.PodAssignment) -> bool:
                pod = gang.pods.get(gang.submitted[assignment.pod_index])
                if pod is None:
                    return False
                if pod.node:
                    return pod.node == assignment.node
                return await self._bind_pod(gang.job_id, generation, pod, assignment, how)

            try:
                results = await asyncio.gather(*(bind_one(assignment) for assignment in placed), return_exceptions=True)
            finally:
                self.binding -= 1
                if not self.binding:
                    self.quiet.set()
            for assignment, result in zip(placed, results, strict=True):
                member = self._member(gang, assignment.pod_index)
                if result is not True and member is not None:
                    self.assumed.pop(member.key, None)  # not bound: it holds no place
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

    async def _bind_pod(self, job_id: str, generation: int, pod: Pod, assignment: core.PodAssignment, how: str) -> bool:
        """One pod's Binding with its assignment's annotations, counted, with its Scheduled Event."""
        key = pod.key
        annotations = core.assignment_annotations(job_id, generation, assignment, self.nodes.get(assignment.node))
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

    async def _replace(self, gang: Gang, taken: list[tuple[int, PodKey, Pod, core.PodAssignment]]) -> None:
        """Bind pods that took the places of members gone (`Submissions._replace_members`); a place whose
        Binding fails goes back to the member that left it, so its pod is told again."""
        try:
            for index, gone, pod, assignment in taken:
                try:
                    done = await self._bind_pod(gang.job_id, gang.generation, pod, assignment, "replacement")
                except Exception as error:  # the API refused or went away: the pod waits, told why
                    log.warning("a replacement's binding failed", extra={"job": gang.job_id, "reason": str(error)})
                    done = False
                if not done and index < len(gang.submitted) and gang.submitted[index] == pod.key:
                    self.assumed.pop(pod.key, None)
                    gang.submitted = (*gang.submitted[:index], gone, *gang.submitted[index + 1 :])
                elif done:
                    REPLACEMENTS.inc()
        finally:
            self.busy.discard(gang.job_id)
            self.touch(gang.job_id)

    def _member(self, gang: Gang, index: int) -> Pod | None:
        if 0 <= index < len(gang.submitted):
            return gang.pods.get(gang.submitted[index])
        return None

    async def _retry_apply(self, gang: Gang, generation: int, placed: list[core.PodAssignment], how: str) -> None:
        await asyncio.sleep(1.0)
        await self._apply(gang, generation, placed, how)

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
