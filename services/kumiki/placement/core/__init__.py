"""Placement's pure core: the allocation book of the live cluster.

It drives the scheduling core (`kumiki.sched`: the simulator's very `Scheduler` and placement code) with what
a live service needs and a simulator does not: nodes that come, change, turn unhealthy and go; binds that are
idempotent per (job, generation); jobs held back by quota; a table that can be rebuilt from the events it
published; and Explain. Every arrival, release and node change is a scheduling pass of the core's queue
policy (ordering, reservation for the blocked head, backfill). No I/O and no clock: adapters pass the time,
publish and persist.

Modules: commands (a Bind and the book's answers, and the job as the queue policy sees it), book
(`PlacementBook`); idle-reclaim rules per queue come from the scheduling core (`kumiki.sched.idle`), which the
simulator applies too. Nothing here reads or builds wire messages: placement.adapters.convert turns
requests and events into these values and back.
"""

from __future__ import annotations

from kumiki.placement.core.book import ENDED_KEPT, LIVE_POLICIES, YIELD_ROUNDS, PlacementBook, Victim
from kumiki.placement.core.commands import (
    BindCommand,
    BindConflict,
    BindOutcome,
    BoundJob,
    Explanation,
    PendingJob,
    ServiceSoFar,
    job_view,
    queued_reason,
    quota_reason,
)
from kumiki.sched.idle import IDLE_MODES, IdlePolicy, parse_idle_reclaim

__all__ = [
    "ENDED_KEPT",
    "IDLE_MODES",
    "LIVE_POLICIES",
    "YIELD_ROUNDS",
    "BindCommand",
    "BindConflict",
    "BindOutcome",
    "BoundJob",
    "Explanation",
    "IdlePolicy",
    "PendingJob",
    "PlacementBook",
    "ServiceSoFar",
    "Victim",
    "job_view",
    "parse_idle_reclaim",
    "queued_reason",
    "quota_reason",
]
