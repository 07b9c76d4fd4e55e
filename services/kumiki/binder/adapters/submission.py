"""The submission loop: which gangs go to Placement and when, with which generation, and what their pods
and PodGroup say while they wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace

from kumiki.binder import core
from kumiki.binder.adapters import convert
from kumiki.binder.adapters.binding import Binding
from kumiki.binder.adapters.metrics import AFFINITY_REFRESHED, BIND_SECONDS, GANGS, PENDING, REASONS_REFRESHED
from kumiki.binder.adapters.placement import PlacementUnavailable
from kumiki.binder.adapters.state import counts_other_pods, gang_attributes, tracer
from kumiki.binder.core import Gang, Pod
from kumiki.common import requests
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2

log = logging.getLogger(__name__)

EVICTING = "the pod group's previous generation is being evicted: these pods run its next one once it is released"


class Submissions(Binding):
    """Submits through `Binding`: an answer of BOUND binds at once."""

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
                    if late and self.evicting.get(job_id, 0) >= gang.generation:
                        # The next generation's pods: the job's controller made them once the eviction deleted
                        # the old ones, before the coordinator's PREEMPTED reached us. They are no replacements:
                        # Placement may have given the evicted members' GPUs away already. They wait for the
                        # release (`_evicted`), then go to Placement as the next generation.
                        self._tell_late(gang, late, "PreviousGenerationEvicting", EVICTING)
                        continue
                    if late and self._replace_members(gang, late):
                        continue
                    if late:
                        self._tell_late(
                            gang, late, "GroupAlreadyPlaced", "the pod group was placed before this pod joined it"
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
                    elif self._affinity_stale(gang):
                        AFFINITY_REFRESHED.inc()
                        self.busy.add(job_id)
                        self._spawn(self._submit(gang))
                    elif self._reason_due(gang, now):
                        self.busy.add(job_id)
                        self._spawn(self._refresh_reason(gang))
                    continue  # queued in Placement as it is: its bind arrives on job.lifecycle
                if gang.group and not gang.min_member and now - gang.last_join < self.settle_s:
                    continue  # a group without a PodGroup: wait until its pods stop arriving
                self.busy.add(job_id)
                self._spawn(self._submit(gang))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=0.25)

    def _tell_late(self, gang: Gang, late: list[Pod], reason: str, message: str) -> None:
        """Each late pod of a placed gang is told once why it waits, however many arrive one after another."""
        told = self.told_late.setdefault(gang.job_id, set())
        untold = [pod for pod in late if pod.key not in told]
        if not untold:
            return
        told.update(pod.key for pod in untold)
        gang.reason = ""  # the gang's reason reads the same, but these pods have not heard it
        self._spawn(self._tell_pending(gang, untold, reason, message))

    def _replace_members(self, gang: Gang, late: list[Pod]) -> bool:
        """Late pods of a placed gang that ask for what a deleted member asked take its place: Placement still
        holds that member's node and GPUs for the gang (a worker a Job or training operator recreated). Only
        where the node still takes the pod (schedulable, its node rules, pod affinity). True when some did."""
        logged = self.logged.get(gang.job_id)
        if logged is None or logged.generation != gang.generation or logged.state != events_pb2.JOB_STATE_BOUND:
            return False
        assignments = {assignment.pod_index: assignment for assignment in logged.assignments}
        taken = []
        for index, pod in core.replacements(gang, logged.pods, late):
            assignment = assignments.get(index)
            node = self.nodes.get(assignment.node) if assignment is not None else None
            if assignment is None or node is None or node.why_not or pod.rules.why_not(node):
                continue
            if self.affine_pods and self.affinity(pod, self.placed([pod]), [pod]).why_not(node):
                continue
            taken.append((index, gang.submitted[index], pod, assignment))
        if not taken:
            return False
        submitted = list(gang.submitted)
        for index, _, pod, assignment in taken:
            submitted[index] = pod.key
            self.assumed[pod.key] = assignment.node  # placed from now on for every gang's pod affinity
        gang.submitted = tuple(submitted)
        self.pods_moved()
        self.busy.add(gang.job_id)
        self._spawn(self._replace(gang, taken))
        return True

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
        shared = core.GangAffinity()
        if any(pod.affinity or pod.spread for pod in pods):
            shared = core.gang_affinity([(pod.key.namespace, pod.labels, pod.affinity) for pod in pods])
            shared = shared.also(core.gang_spread([(pod.labels, pod.spread) for pod in pods]))
            if shared.refusal:
                await self._tell_pending(gang, pods, "InvalidRequest", shared.refusal)
                self.retry_at[gang.job_id] = time.monotonic() + 30  # or when its pods change
                return
        candidates = [node for node in self.nodes.values() if node.schedulable]
        choices, affine = self._node_choices(pods, candidates)
        gang.affinity_choices = tuple(choices) if affine else None
        gang.placed_seen = self.placed_changes
        for pod, choice in zip(pods, choices, strict=True):
            if choice.none_because:
                self.retry_at[gang.job_id] = time.monotonic() + 30  # look again then, or when nodes change
                self.never_fit.add(gang.job_id)
                if affine:  # the pods it is to keep to or away from may come or go
                    self.waiting_for_pods.add(gang.job_id)
                    message = f"{pod.key.name}: {choice.none_because} (node rules, pod affinity, topology spread)"
                    await self._tell_pending(gang, pods, "Unschedulable", message)
                    return
                message = f"{pod.key.name}: {choice.none_because} (nodeSelector, node affinity, tolerations)"
                await self._tell_pending(gang, pods, "NeverFits", message)
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
        request.topology.CopyFrom(convert.topology_constraint(core.gang_topology(fields["topology"], shared)))
        request.topology.distinct_nodes = shared.distinct_nodes
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
            gang.rules_note = ""
            if ruled:  # Placement looked only at the nodes the rules admit: say so, the cluster may have room
                admitted = len(ruled[0].nodes) or len(candidates) - len(ruled[0].avoid)
                rules = "node rules and pod affinity" if affine else "node rules"
                gang.rules_note = f" (on the {admitted} of {len(candidates)} nodes its {rules} admit)"
            await self._tell_pending(gang, pods, reason, message + gang.rules_note)

    def _node_choices(self, pods: list[Pod], candidates: list[core.Node]) -> tuple[list[core.NodeChoice], bool]:
        """Each pod's node rules, pod (anti-)affinity and topology spread resolved against the schedulable nodes
        and the placed pods, its preferences scored over the nodes left, and whether the placed pods shaped them
        (the pods have terms or constraints, or a placed pod's terms restrict or score them): only then are they
        resolved again when pods move. A gang that a pod placed later restricts is marked then
        (`restrict_waiting`) and resolved again too."""
        assert self.capacity is not None
        tainted = self.capacity.tainted
        scoring = self.capacity.prefer_tainted or bool(self.scoring_pods) or any(pod.preferences.any for pod in pods)
        if not self.affine_pods and not scoring:
            return [core.node_choice(pod.rules, candidates, tainted) for pod in pods], False
        placed = self.placed(pods)
        choices = []
        shaped = False
        for pod in pods:
            refuse = None
            if self.affine_pods:
                affinity = self.affinity(pod, placed, pods)
                shaped = shaped or affinity.restricts or bool(pod.affinity or pod.spread)
                refuse = affinity.why_not if affinity.restricts else None
            choice = core.node_choice(pod.rules, candidates, tainted, refuse)
            if scoring and not choice.none_because:  # over every schedulable node: pods count wherever they are
                scores = core.pod_scores(pod, placed, candidates)
                choice = replace(choice, prefer=tuple(sorted(scores.items())))
                # scores placed pods shaped: its own terms or constraints, or a placed pod's preferred terms
                # selecting it (not merely some placed pod having such terms: that would look at every waiting
                # gang again on every move)
                shaped = (
                    shaped
                    or counts_other_pods(pod)
                    or any(
                        term.selects(other.namespace, pod.key.namespace, pod.labels)
                        for other in placed
                        if other.preferred
                        for _, term in other.preferred
                    )
                )
            choices.append(choice)
        return choices, shaped

    def _affinity_stale(self, gang: Gang) -> bool:
        """A gang queued in Placement whose node lists pod affinity shaped, and pods have moved since: resolved
        again, do they differ? (Then it is submitted again: Placement requeues it in its place with the new lists.)"""
        if gang.affinity_choices is None or gang.placed_seen == self.placed_changes:
            return False
        gang.placed_seen = self.placed_changes
        if self.capacity is None:
            return True
        candidates = [node for node in self.nodes.values() if node.schedulable]
        choices, _ = self._node_choices(gang.waiting(), candidates)
        return tuple(choices) != gang.affinity_choices

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

    def _reason_due(self, gang: Gang, now: float) -> bool:
        """A gang waiting in Placement's queue whose shown reason is older than `reason_refresh_s`."""
        return bool(
            self.reason_refresh_s
            and gang.reason
            and not gang.timed_out
            and now - gang.reason_checked >= self.reason_refresh_s
        )

    async def _refresh_reason(self, gang: Gang) -> None:
        """Placement's reason as of now for a gang it still queues: what blocks a waiting gang changes while its
        pods do not (the jobs ahead of it end, nodes fill or drain), and its pods should say what blocks it now.
        Placement's Explain reads its book and changes nothing; an unanswered call waits for the next refresh."""
        try:
            try:
                async with self.slots:  # shared with submissions: at most KUMIKI_BINDER_CONCURRENCY calls at once
                    answer = await self.placement.explain(gang.job_id)
            except PlacementUnavailable as error:
                log.debug("reason refresh: placement unavailable", extra={"job": gang.job_id, "reason": str(error)})
                return
            pods = gang.waiting()
            if answer.status != "pending" or not pods or gang.bound or tuple(p.key for p in pods) != gang.submitted:
                return  # bound meanwhile (its event is on its way), or its pods changed (it goes again)
            reason, message = core.reason_text(convert.pending_reason(reason) for reason in answer.reasons)
            if await self._tell_pending(gang, pods, reason, message + gang.rules_note):
                REASONS_REFRESHED.inc()
        finally:
            gang.reason_checked = time.monotonic()
            self.busy.discard(gang.job_id)

    async def _tell_pending(
        self, gang: Gang, pods: list[Pod], reason: str, message: str, phase: str = "Pending"
    ) -> bool:
        """PodScheduled=False with the reason, an Event on each pod and on the PodGroup (when it changed);
        False when the pods already say so."""
        gang.reason_checked = time.monotonic()
        text = f"{reason}: {message}"
        if gang.reason == text:
            return False
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
        return True

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
