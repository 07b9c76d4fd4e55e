"""cluster.state, followed without a consumer group: the GPUs each node can take work on now, for the capacity
quota lends (`quota.core.capacity`). Every replica reads the whole compacted topic; a tombstone removes a node."""

from __future__ import annotations

from prometheus_client import Gauge

from kumiki.common.bus import Event
from kumiki.common.contracts.v1 import events_pb2
from kumiki.quota.adapters.convert import node_gpus
from kumiki.quota.core import ANY_MODEL

LIVE_GPUS = Gauge(
    "kumiki_quota_live_gpus", "GPUs that can take work now, per model (cluster.state; model any: all)", ["model"]
)


class LiveNodes:
    """node -> (GPU model, usable GPUs), from cluster.state, with the sums per model kept as records arrive."""

    def __init__(self) -> None:
        self.nodes: dict[str, tuple[str, float]] = {}
        self.gpus: dict[str, float] = {ANY_MODEL: 0.0}  # model -> usable GPUs; ANY_MODEL: all of them

    async def __call__(self, key: str, event: Event | None) -> None:
        name = key
        after: tuple[str, float] | None = None
        if event is not None:
            state = event.payload
            assert isinstance(state, events_pb2.NodeState)
            name, after = state.node or key, node_gpus(state)
        before = self.nodes.get(name)
        if before == after:
            return  # a heartbeat: nothing quota counts changed
        if before is not None:
            self._count(*before, -1.0)
        if after is None:
            del self.nodes[name]
        else:
            self.nodes[name] = after
            self._count(*after, 1.0)

    def _count(self, model: str, gpus: float, sign: float) -> None:
        for counted in {model, ANY_MODEL}:
            self.gpus[counted] = self.gpus.get(counted, 0.0) + sign * gpus
            LIVE_GPUS.labels(counted or "any").set(self.gpus[counted])

    def capacity(self) -> dict[str, float] | None:
        """Usable GPUs per model and in all (ANY_MODEL); None while no node has been seen."""
        return dict(self.gpus) if self.nodes else None
