"""Known nodes: a sample from a node nobody registered is rejected (dead-lettered with a reason)."""

from __future__ import annotations

from collections.abc import Sequence


class NodeRegistry:
    """Nodes registered by an inventory (the agent, or the DCGM ingest's synthetic one) or by a cluster.state
    record, per source topic: a tombstone on one topic removes the node from that topic only."""

    def __init__(self) -> None:
        self._by_source: dict[str, set[str]] = {}
        self._known: set[str] = set()

    def record(self, source: str, node: str, present: bool) -> None:
        nodes = self._by_source.setdefault(source, set())
        if present:
            nodes.add(node)
            self._known.add(node)
        elif node in nodes:
            nodes.discard(node)
            if not any(node in others for others in self._by_source.values()):
                self._known.discard(node)

    def has(self, source: str, node: str) -> bool:
        return node in self._by_source.get(source, ())

    def __contains__(self, node: object) -> bool:
        return node in self._known

    def __len__(self) -> int:
        return len(self._known)


def unknown_node_reason(node: str, sources: Sequence[str]) -> str:
    """The dead-letter reason: names the field, the node and where a registration was looked for."""
    return f"unknown node: node: {node!r} has no record on {' or '.join(sources)}"
