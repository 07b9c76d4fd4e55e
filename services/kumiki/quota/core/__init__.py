"""Quota rules, pure: the queue tree and its validation, admission, reclaim victims, hierarchical DRF fair
share with decayed usage, and ledger arithmetic; one module per concept, every name re-exported here.

The quota service and the simulator call the same functions: state in, decisions out. Nothing here does
I/O or reads a clock; times are passed in (microseconds since the epoch for the ledger, seconds elsewhere).

Semantics in one place:
- A queue's guarantee is GPUs per model plus GPUs of any model (key ""). A job is inside the guarantee when
  its leaf queue's non-borrowed use plus the job fits the guarantee (children's guarantees nest inside their
  parent's, so the leaf decides). Inside the guarantee a job is admitted even when borrowers hold the GPUs:
  the shortfall is reclaimed from them.
- Beyond the guarantee only preemptible work is admitted, as borrowed, and only onto idle GPUs.
- A hard limit caps a whole subtree, borrowed work included.
- Reclaim takes borrowed work only, from the most over-quota queue first, judged where the beneficiary's and
  the victim's paths diverge (the victim's side must be above its guarantee there). A queue within its
  guarantee is protected and never a reason to stop looking elsewhere (kai-scheduler/KAI-Scheduler#1750).

Modules: resources (ANY_MODEL, EPSILON, Resources), tree (the queue file and its invariants), capacity (the
file's capacity shrunk to the GPUs up now), admission,
reclaim, fairshare, status (what quota.state publishes), ledger (with its own LifecycleState). Nothing here
reads or builds wire messages (protobuf): quota.adapters.convert turns requests, responses and lifecycle states
into these values and back.
"""

from __future__ import annotations

from kumiki.quota.core.admission import (
    Admission,
    AdmitRequest,
    Holding,
    Outcome,
    UsageView,
    decide_admission,
    guarantee_headroom,
    idle_gpus,
    may_submit,
    usage_view,
)
from kumiki.quota.core.capacity import effective_capacity, with_live_capacity
from kumiki.quota.core.fairshare import decay_factor, decayed_usage, fair_shares, usage_factor
from kumiki.quota.core.ledger import (
    CLOSING_STATES,
    MICROS,
    OPENING_STATES,
    RELEASING_STATES,
    Effect,
    Ledger,
    LedgerEntry,
    LifecycleState,
    OpenInterval,
    cost,
    gpu_seconds,
    gpus_decimal,
    lifecycle_effect,
    overlap_micros,
    team_of,
    timestamp_micros,
)
from kumiki.quota.core.reclaim import choose_victims, reclaim_decision_id, with_reclaiming
from kumiki.quota.core.resources import ANY_MODEL, EPSILON, Resources
from kumiki.quota.core.status import QueueStatus, queue_statuses
from kumiki.quota.core.tree import Queue, QueueConfigError, QuotaConfig, build_config, flat_config, parse_config

__all__ = [
    "ANY_MODEL",
    "CLOSING_STATES",
    "EPSILON",
    "MICROS",
    "OPENING_STATES",
    "RELEASING_STATES",
    "Admission",
    "AdmitRequest",
    "Effect",
    "Holding",
    "Ledger",
    "LedgerEntry",
    "LifecycleState",
    "OpenInterval",
    "Outcome",
    "Queue",
    "QueueConfigError",
    "QueueStatus",
    "QuotaConfig",
    "Resources",
    "UsageView",
    "build_config",
    "choose_victims",
    "cost",
    "decay_factor",
    "decayed_usage",
    "decide_admission",
    "effective_capacity",
    "fair_shares",
    "flat_config",
    "gpu_seconds",
    "gpus_decimal",
    "guarantee_headroom",
    "idle_gpus",
    "lifecycle_effect",
    "may_submit",
    "overlap_micros",
    "parse_config",
    "queue_statuses",
    "reclaim_decision_id",
    "team_of",
    "timestamp_micros",
    "usage_factor",
    "usage_view",
    "with_live_capacity",
    "with_reclaiming",
]
