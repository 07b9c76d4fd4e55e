"""Placement's side of preemption: publishing the victims a pass names, and releasing evicted attempts.

The scheduling pass decides the victims (`PlacementBook.cycle`); each is published as a PREEMPT decision with
its reason and unsaved work, which the preemption coordinator turns into CHECKPOINT, EVICT and finally
`Release(JOB_STATE_PREEMPTED)`: the attempt is freed, published as PREEMPTED with its lost work, and the job
queued again as the next generation, all acknowledged by the broker before the coordinator hears yes.

Traces: each victim is a `preempt` span (a child of the pass's decision, the beneficiary's `schedule`) whose
PREEMPT event the coordinator continues; the Release that requeues the victim remembers its context, and the
pass that binds the next generation is a `schedule` span under it, so requeue and rebind are in that trace too.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace

from opentelemetry import context as otel_context
from opentelemetry import trace
from prometheus_client import Counter, Histogram

from kumiki.common.contracts.v1 import placement_pb2
from kumiki.placement.adapters.admission import Admission
from kumiki.placement.adapters.events import DecisionPublisher
from kumiki.placement.core import BoundJob, PlacementBook, Victim

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.placement")
_REQUEUED: OrderedDict[tuple[str, int], otel_context.Context] = OrderedDict()  # next generation -> Release's
_REQUEUED_KEPT = 10_000  # a requeued job never bound (withdrawn) must not grow this forever

PREEMPT_DECISIONS = Counter(
    "kumiki_placement_preemptions_total", "Victims named by placement's scheduling pass, by reason", ["reason"]
)
RELEASE_SECONDS = Histogram(
    "kumiki_placement_preemption_release_seconds",
    "From placement's preemption decision to the victim's PREEMPTED release (GPUs held meanwhile), by reason",
    ["reason"],
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800),
)


async def publish_preemptions(book: PlacementBook, publisher: DecisionPublisher) -> int:
    """Publish the victims decided so far, in order; one that fails stays for the next cycle (it keeps running,
    and what was placed on its GPUs stays nominated, until its decision is out and the coordinator evicts it)."""
    published = 0
    while book.preemptions:
        victim = book.preemptions.pop(0)  # taken before awaiting: a concurrent pass does not publish it twice
        try:
            with tracer.start_as_current_span("preempt", attributes=_victim_attributes(victim)):
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
    book: PlacementBook, publisher: DecisionPublisher, admission: Admission, request: placement_pb2.ReleaseRequest
) -> placement_pb2.ReleaseResponse:
    """Free an evicted attempt and queue the next generation: published first, then applied to the book (a
    failed publication changes nothing and the coordinator retries; a repeated release finds nothing).

    The PREEMPTED event ends the attempt's quota admission, so the next generation asks quota again before it
    may run: without that, a resumed borrower would hold GPUs quota no longer counts, past a queue's limit and
    out of reach of reclaim. Denied (or quota unreachable), it is held and asked again each cycle. A victim
    evicted for a job quota still holds back is not asked now: it waits behind that job (`freed_for_held`)."""
    job = book.preempted_attempt(request.job.job_id, request.job.generation)
    claim = (request.job.job_id, job.command.generation if job is not None else 0)
    if job is None or claim in book.releasing:
        return placement_pb2.ReleaseResponse(released=False, gpus_freed=0.0)
    now = time.time()
    again = replace(job.command, generation=job.command.generation + 1)
    beneficiary = request.beneficiary.job_id
    # while this publishes and quota is asked, the attempt cannot also end as COMPLETED (grpc Release); the book
    # is updated with no await between the claim's end and it
    book.releasing.add(claim)
    try:
        # placement's own while the victim drains; after a restart, the coordinator's (from the PREEMPT decision)
        cause = book.eviction_cause(request.job.job_id, request.preemption_reason)
        await publisher.requeued(job, again, request.lost_gpu_seconds, max(0.0, now - job.bound_s), cause)
        denied = None if book.freed_for_held(beneficiary) else await admission.admit(again)  # held behind it then
    finally:
        book.releasing.discard(claim)
    if trace.get_current_span().get_span_context().is_valid:
        _REQUEUED[(again.job_id, again.generation)] = otel_context.get_current()
        while len(_REQUEUED) > _REQUEUED_KEPT:
            _REQUEUED.popitem(last=False)
    decided = book.draining.get(request.job.job_id)
    book.release_preempted(
        request.job.job_id, request.job.generation, now, beneficiary, denied, request.lost_gpu_seconds, cause
    )  # what it published: a restart folds the same PREEMPTED event into the job's service so far
    if decided is not None and decided.job is job and decided.decided_s:  # a decision this placement made
        RELEASE_SECONDS.labels(decided.preemption.reason).observe(max(0.0, now - decided.decided_s))
    return placement_pb2.ReleaseResponse(released=True, gpus_freed=job.command.request.gpu_demand)


def _victim_attributes(victim: Victim) -> dict[str, str | int | float]:
    job, preemption = victim.job, victim.preemption
    return {
        "kumiki.job.id": job.command.job_id,
        "kumiki.job.generation": job.command.generation,
        "kumiki.queue": job.command.queue,
        "kumiki.gpus": job.command.request.gpu_demand,
        "kumiki.preemption.reason": preemption.reason,
        "kumiki.preemption.beneficiary": preemption.for_job,
        "kumiki.preemption.lost_gpu_seconds": preemption.lost_gpu_s,
    }


@contextlib.contextmanager
def rebinding(job: BoundJob) -> Iterator[None]:
    """Around publishing a pass's start: a requeued generation's bind is a `schedule` span in its
    preemption's trace (under the Release that requeued it); any other start is left as it was."""
    parent = _REQUEUED.pop((job.command.job_id, job.command.generation), None)
    if parent is None:
        yield
        return
    attributes: dict[str, str | int | float | bool | list[str]] = {
        "kumiki.job.id": job.command.job_id,
        "kumiki.job.generation": job.command.generation,
        "kumiki.queue": job.command.queue,
        "kumiki.gpus": job.command.request.gpu_demand,
        "kumiki.pods": len(job.command.request.pods),
        "kumiki.requeued": True,
        "kumiki.outcome": "bound",
        "kumiki.nodes": sorted(set(job.node_names)),
    }
    with tracer.start_as_current_span("schedule", context=parent, attributes=attributes):
        yield
