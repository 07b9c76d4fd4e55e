"""Per key level, its last `window` started jobs in start order, whatever their length (pure).

Both the censored expert and the models' running scores count this sample: jobs enter by start, not by end,
so a sweep of long runs is in it while it runs, and the length-biased sample of the jobs running at a moment
is not (docs/design/0003-forecast-trust.md, fourteenth step). A job is kept while any of its key levels'
lanes still holds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from kumiki.forecast.models.history import Key


class LaneMember(Protocol):
    lanes: int  # lanes still holding the job (forgotten at 0)


MemberT = TypeVar("MemberT", bound=LaneMember)


@dataclass(slots=True)
class KeyLanes(Generic[MemberT]):
    window: int
    members: dict[str, MemberT] = field(default_factory=dict)
    lanes: dict[Key, deque[str]] = field(default_factory=dict)

    def enter(
        self,
        job_id: str,
        member: MemberT,
        keys: Iterable[Key],
        leaving: Callable[[Key, str, MemberT], None] | None = None,
    ) -> MemberT:
        """Add a job to each key's lane; a full lane's oldest job leaves it (`leaving` is told first)."""
        self.members[job_id] = member
        for key in keys:
            lane = self.lanes.get(key)
            if lane is None:
                lane = self.lanes[key] = deque()
            if len(lane) >= self.window:
                oldest = lane.popleft()
                gone = self.members[oldest]
                if leaving is not None:
                    leaving(key, oldest, gone)
                gone.lanes -= 1
                if gone.lanes == 0:
                    del self.members[oldest]
            lane.append(job_id)
            member.lanes += 1
        return member

    def size(self, key: Key) -> int:
        lane = self.lanes.get(key)
        return 0 if lane is None else len(lane)
