"""Placement's side of preemption: publishing the victims a pass names, and releasing evicted attempts.

The scheduling pass decides the victims (`PlacementBook.cycle`); each is published as a PREEMPT decision with
its reason and unsaved work, which the preemption coordinator turns into CHECKPOINT, EVICT and finally
`Release(JOB_STATE_PREEMPTED)`: the attempt is freed, published as PREEMPTED with its lost work, and the job
queued again as the next generation, all acknowledged by the broker before the coordinator hears yes.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from prometheus_client import Counter

from kumiki.common.contracts.v1 import placement_pb2
from kumiki.placement.adapters.events import DecisionPublisher
from kumiki.placement.core import PlacementBook

log = logging.getLogger(__name__)

PREEMPT_DECISIONS = Counter(
    "kumiki_placement_preemptions_total", "Victims named by placement's scheduling pass, by reason", ["reason"]
)


async def publish_preemptions(book: PlacementBook, publisher: DecisionPublisher) -> int:
    """Publish the victims decided so far, in order; one that fails stays for the next cycle (it keeps running,
    and what was placed on its GPUs stays nominated, until its decision is out and the coordinator evicts it)."""
    published = 0
    while book.preemptions:
        victim = book.preemptions.pop(0)  # taken before awaiting: a concurrent pass does not publish it twice
        try:
            await publisher.preempted(victim)
        except Exception as error:
            if victim.job.command.job_id in book.draining:
                book.preemptions.insert(0, victim)
            log.error(
                "preemption decision not published; retried next cycle",
                extra={"job": victim.job.command.job_id, "error": repr(error)},
            )
            return published
        PREEMPT_DECISIONS.labels(victim.preemption.reason).inc()
        published += 1
    return published


async def release_preempted(
    book: PlacementBook, publisher: DecisionPublisher, request: placement_pb2.ReleaseRequest
) -> placement_pb2.ReleaseResponse:
    """Free an evicted attempt and queue the next generation: published first, then applied to the book (a
    failed publication changes nothing and the coordinator retries; a repeated release finds nothing)."""
    job = book.preempted_attempt(request.job.job_id, request.job.generation)
    if job is None:
        return placement_pb2.ReleaseResponse(released=False, gpus_freed=0.0)
    now = time.time()
    again = replace(job.command, generation=job.command.generation + 1)
    submitted_s = job.bound_s - job.waited_s
    await publisher.requeued(job, again, request.lost_gpu_seconds, max(0.0, now - job.bound_s), submitted_s)
    book.release_preempted(request.job.job_id, request.job.generation, now, request.beneficiary.job_id)
    return placement_pb2.ReleaseResponse(released=True, gpus_freed=job.command.request.gpu_demand)
