"""kumiki.telemetry.core.registry: known nodes and the dead-letter reason for an unknown one."""

from __future__ import annotations

from kumiki.telemetry import core


def test_a_node_is_known_from_any_registration_until_every_source_drops_it() -> None:
    registry = core.NodeRegistry()
    assert "n1" not in registry
    registry.record("node.inventory", "n1", True)
    registry.record("cluster.state", "n1", True)
    registry.record("cluster.state", "n2", True)
    assert "n1" in registry and "n2" in registry and len(registry) == 2
    registry.record("node.inventory", "n1", False)  # a tombstone on one topic
    assert "n1" in registry
    registry.record("cluster.state", "n1", False)
    assert "n1" not in registry and len(registry) == 1
    registry.record("node.inventory", "n3", False)  # a tombstone for a node never seen changes nothing
    assert "n3" not in registry and len(registry) == 1


def test_the_unknown_node_reason_names_the_field_the_node_and_where_it_was_looked_for() -> None:
    reason = core.unknown_node_reason("gpu-node-9", ["p.node.inventory", "p.cluster.state"])
    assert reason == "unknown node: node: 'gpu-node-9' has no record on p.node.inventory or p.cluster.state"
