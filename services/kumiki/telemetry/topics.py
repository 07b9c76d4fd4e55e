"""The one topic telemetry ingest adds to the registry: the agents' node inventories.

It belongs in kumiki.common.bus.topics beside the others; it lives here until that registry takes it
(the agent's Kafka sink imports it from here). The payload is a NodeState holding the agent's static view
(GPUs, memory, MIG layout, NVLink islands); telemetry merges it with live samples and allocations into
the NodeState it publishes on cluster.state.
"""

from __future__ import annotations

from kumiki.common.bus.topics import CLUSTER_STATE, TopicSpec

NODE_INVENTORY = TopicSpec(
    "node.inventory",
    CLUSTER_STATE.payload,
    "node",
    cleanup_policy="compact",
    validate=CLUSTER_STATE.validate,
)
