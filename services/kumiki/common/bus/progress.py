"""Commit progress of a consumer group, pure: which partitions have records waiting that the group's committed
offset has not moved past for too long.

A consumer that commits what it acknowledged (faust's at-least-once) can go on reading and processing while
its commits stop: an offset its bookkeeping never saw acknowledged holds every later one back, and nothing
says so. From outside the stall is plain: records wait behind a committed offset that no longer moves.
Lag alone is not a stall (a busy consumer is behind and moving), so the clock runs from the first look that
found records waiting behind the committed offset it still has.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

Partition = TypeVar("Partition", bound=Hashable)


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    committed: int  # the group's committed offset: the next record it would read after a restart
    end: int  # the partition's end offset when last looked at
    since: float  # the first look with records waiting behind this committed offset

    @property
    def behind(self) -> int:
        return max(0, self.end - self.committed)


def advance(
    previous: Mapping[Partition, PartitionProgress],
    committed: Mapping[Partition, int],
    ends: Mapping[Partition, int],
    now: float,
) -> dict[Partition, PartitionProgress]:
    """The progress after one look at the group: a partition the group never committed on counts from 0 (it
    reads from the earliest record); one no longer looked at is forgotten (it moved to another worker)."""
    progress: dict[Partition, PartitionProgress] = {}
    for partition, end in ends.items():
        offset = max(0, committed.get(partition, 0))
        before = previous.get(partition)
        since = now
        if before is not None and offset == before.committed and before.behind > 0 and offset < end:
            since = before.since  # still waiting behind the same committed offset
        progress[partition] = PartitionProgress(offset, end, since)
    return progress


def stalled(
    progress: Mapping[Partition, PartitionProgress], now: float, stall_s: float
) -> dict[Partition, PartitionProgress]:
    """The partitions with records waiting behind a committed offset that has not moved for `stall_s`."""
    return {
        partition: state for partition, state in progress.items() if state.behind > 0 and now - state.since >= stall_s
    }


def oldest_wait_s(progress: Mapping[Partition, PartitionProgress], now: float) -> float:
    """How long the longest-waiting partition has had records behind an unmoving committed offset (0 when
    every partition is caught up): the gauge an operator alerts on before the watch gives up."""
    return max((now - state.since for state in progress.values() if state.behind > 0), default=0.0)
