"""Telemetry ingest's pure core: per-node chunks of readings, node state, job ↔ GPU allocations, idle
detection and usage roll-ups. The faust agents in `adapters/` only move these values between topics and
tables; every decision is here, deterministic and clock-free (time comes in as arguments).

Data flow (see docs/telemetry.md):
  samples  --summarise-->  NodeChunk (per node and time bucket)  --apply_chunk-->  NodeRecord
  job.lifecycle  --allocation_changes-->  AllocationChange (per node)  --apply_allocation-->  NodeRecord
  NodeRecord  --node_view-->  NodeView (what cluster.state carries)  and IdleFinding (gpu.idle), BusyFinding (gpu.busy)
Everything a table stores has `to_json`/`from_json`, so faust's changelog can restore it.

One module per concept: `config`, `chunks` (readings grouped per node and bucket), `windows` (window
aggregates), `allocations` (job.lifecycle), `records` (the node record and its inventory), `idle` (folding
a chunk: idle and busy findings and usage), `views` (cluster.state and when to publish it), `registry` (known nodes),
`agents` (which node an agent may speak for).
This package re-exports all of their public names, so `core.Name` works whichever module holds it.
"""

from __future__ import annotations

from kumiki.telemetry.core.agents import (
    ACCOUNTS_VARIABLE,
    AGENT_SIGNATURE_HEADER,
    AGENT_TOKEN_HEADER,
    AUDIENCE_VARIABLE,
    GENERATIONS_VARIABLE,
    KEY_VARIABLE,
    MAX_GENERATION,
    AgentProof,
    agent_refusal,
    missing_proof,
    node_key,
    parse_accounts,
    parse_generations,
    signature,
    signature_refusal,
)
from kumiki.telemetry.core.allocations import (
    ENDING_STATES,
    HOLDING_STATES,
    STATE_BOUND,
    STATE_COMPLETED,
    STATE_FAILED,
    STATE_PREEMPTED,
    STATE_RELEASED,
    STATE_RUNNING,
    AllocationChange,
    Assignment,
    JobPlacement,
    Transition,
    allocation_changes,
)
from kumiki.telemetry.core.chunks import FATAL_XIDS, GpuChunk, NodeChunk, Reading, gpu_key, summarise
from kumiki.telemetry.core.config import IdleRule, TelemetryConfig, parse_idle_rules
from kumiki.telemetry.core.idle import BusyFinding, GpuFinding, IdleFinding, Usage, apply_chunk
from kumiki.telemetry.core.json_types import Json
from kumiki.telemetry.core.records import (
    GpuLive,
    Holding,
    Inventory,
    InventoryGpu,
    NodeRecord,
    apply_allocation,
    apply_inventory,
    check_stale,
)
from kumiki.telemetry.core.registry import NodeRegistry, unknown_node_reason
from kumiki.telemetry.core.views import (
    FREE_GPUS_LABEL,
    GpuView,
    NodeView,
    allocated_vs_used,
    may_need_publication,
    mean,
    node_view,
    publish_decision,
)
from kumiki.telemetry.core.windows import (
    Sums,
    WindowAggregate,
    gpu_aggregate,
    merge_json,
    merge_node_window,
    node_aggregate,
    node_window,
)

__all__ = [
    "ACCOUNTS_VARIABLE",
    "AGENT_SIGNATURE_HEADER",
    "AGENT_TOKEN_HEADER",
    "AUDIENCE_VARIABLE",
    "ENDING_STATES",
    "FATAL_XIDS",
    "FREE_GPUS_LABEL",
    "GENERATIONS_VARIABLE",
    "HOLDING_STATES",
    "KEY_VARIABLE",
    "MAX_GENERATION",
    "STATE_BOUND",
    "STATE_COMPLETED",
    "STATE_FAILED",
    "STATE_PREEMPTED",
    "STATE_RELEASED",
    "STATE_RUNNING",
    "AgentProof",
    "AllocationChange",
    "Assignment",
    "BusyFinding",
    "GpuChunk",
    "GpuFinding",
    "GpuLive",
    "GpuView",
    "Holding",
    "IdleFinding",
    "IdleRule",
    "Inventory",
    "InventoryGpu",
    "JobPlacement",
    "Json",
    "NodeChunk",
    "NodeRecord",
    "NodeRegistry",
    "NodeView",
    "Reading",
    "Sums",
    "TelemetryConfig",
    "Transition",
    "Usage",
    "WindowAggregate",
    "agent_refusal",
    "allocated_vs_used",
    "allocation_changes",
    "apply_allocation",
    "apply_chunk",
    "apply_inventory",
    "check_stale",
    "gpu_aggregate",
    "gpu_key",
    "may_need_publication",
    "mean",
    "merge_json",
    "merge_node_window",
    "missing_proof",
    "node_aggregate",
    "node_key",
    "node_view",
    "node_window",
    "parse_accounts",
    "parse_generations",
    "parse_idle_rules",
    "publish_decision",
    "signature",
    "signature_refusal",
    "summarise",
    "unknown_node_reason",
]
