"""Helpers shared by the binder core's tests: a parsed node with extra labels and taints."""

from __future__ import annotations

from kumiki.binder import core
from tests.binder.support import node_object


def node_named(
    name: str, labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None
) -> core.Node:
    obj = node_object(name)
    obj["metadata"]["labels"].update(labels or {})
    if taints:
        obj["spec"]["taints"] = taints
    return core.parse_node(obj)
