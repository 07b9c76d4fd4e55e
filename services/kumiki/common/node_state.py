"""What every reader of `kumiki.cluster.state` agrees a record means, so Placement (where work may go) and quota
(what it may lend) can never disagree about a node."""

from __future__ import annotations

from kumiki.common.contracts.v1 import events_pb2


def takes_work(state: events_pb2.NodeState) -> bool:
    """A node takes new work while it and every GPU on it is healthy (one failed GPU cordons the node)."""
    return state.healthy and all(gpu.healthy for gpu in state.gpus)
