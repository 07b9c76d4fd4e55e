"""Eviction: a preemption's EVICT command evicts the gang's pods through the Eviction API, and the
coordinator's PREEMPTED release ends it."""

from __future__ import annotations

import asyncio
import logging

from kumiki.binder.adapters.metrics import (
    EVICTIONS,
    EVICTIONS_AWAITING_RELEASE,
    EVICTIONS_CONFIRMED,
    PREEMPTION_COMMANDS,
)
from kumiki.binder.adapters.state import BinderState, gang_attributes, tracer
from kumiki.binder.core import Gang, PodKey
from kumiki.common.bus import Event
from kumiki.common.contracts.v1 import events_pb2

log = logging.getLogger(__name__)

# an attempt the log says ended: an EVICT of it read afterwards evicts what is left, but waits for no release
ATTEMPT_OVER = frozenset({events_pb2.JOB_STATE_PREEMPTED, events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_FAILED})


def action_label(action: events_pb2.PreemptionAction.ValueType) -> str:
    """A command's action as a metric label: `checkpoint`, `evict`, `resume`, or `other` for a value this binder
    does not know (a newer coordinator's)."""
    if action not in events_pb2.PreemptionAction.values():
        return "other"
    return events_pb2.PreemptionAction.Name(action).removeprefix("PREEMPTION_ACTION_").lower()


class Eviction(BinderState):
    """Between an EVICT command and its PREEMPTED release (`evicting`) the gang's pods ending is the eviction,
    not the job's end."""

    async def on_preemption(self, event: Event, connection: object = None) -> None:
        command = event.payload
        assert isinstance(command, events_pb2.PreemptionCommand)
        PREEMPTION_COMMANDS.labels(action_label(command.action)).inc()
        if command.action != events_pb2.PREEMPTION_ACTION_EVICT:
            return  # CHECKPOINT goes to the job's SDK, RESUME is the job's own restart
        job_id, generation = command.job.job_id, command.job.generation
        logged = self.logged.get(job_id)
        over = logged is not None and (  # released already, or ended on its own: no release will come
            logged.generation > generation or (logged.generation == generation and logged.state in ATTEMPT_OVER)
        )
        if not over:
            self.evicting[job_id] = generation
            EVICTIONS_AWAITING_RELEASE.set(len(self.evicting))
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

    def _attempt_over(self, job_id: str, generation: int) -> None:
        """The log says this generation ended (released as PREEMPTED, or completed or failed while an EVICT was on
        its way): an eviction of it or an earlier one is over, and the next generation's pods are watched again."""
        if job_id in self.evicting and self.evicting[job_id] <= generation:
            del self.evicting[job_id]
            EVICTIONS_AWAITING_RELEASE.set(len(self.evicting))

    def _evicted(self, job_id: str, generation: int) -> None:
        """The coordinator released this generation as PREEMPTED: the group's next pods (its job controller makes
        them, resuming from the checkpoint) are the next generation, not late members of a placed gang."""
        if self.synced.is_set():  # not the log's history read again at start
            EVICTIONS_CONFIRMED.inc()
        self._attempt_over(job_id, generation)
        gang = self.gangs.get(job_id)
        if gang is None or gang.generation != generation or not gang.bound:
            return
        gang.bound = False
        gang.released = generation
        gang.submitted = ()
        gang.waiting_since = 0.0
        self.told_late.pop(job_id, None)
        if not any(not pod.deleting and not pod.ended for pod in gang.pods.values()):
            self.gangs.pop(job_id, None)
        self.touch(job_id)
