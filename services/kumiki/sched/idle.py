"""Idle-GPU reclaim rules per queue: what a queue does with a job whose GPUs telemetry reports idle.

Placement applies them to telemetry's findings (kumiki.gpu.idle) and the simulator to its zombie jobs, through
the same `IdlePolicy.reclaims`, so the two decide alike."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """What a queue does with a job whose GPUs telemetry reports idle (kumiki.gpu.idle): `never` reclaim it,
    reclaim it `after` `idle_s` seconds idle, or only when someone `waiting` could use the GPUs."""

    mode: str = "never"
    idle_s: float = 0.0

    def may_reclaim(self, idle_for_s: float) -> bool:
        """Whether a job idle this long is reclaimed, given someone waits (`waiting`) or not (`after`)."""
        return self.mode != "never" and idle_for_s >= self.idle_s

    def reclaims(self, idle_for_s: float, anyone_waiting: bool) -> bool:
        """Whether a job idle this long is reclaimed now: past the rule's time, and under `waiting` only while
        another job waits for GPUs (queued, or held back by quota)."""
        return self.may_reclaim(idle_for_s) and (self.mode == "after" or anyone_waiting)


IDLE_MODES = ("never", "after", "waiting")


def rule_for(rules: Mapping[str, IdlePolicy], queue: str) -> IdlePolicy:
    """The queue's own rule, else the `*` rule, else never."""
    return rules.get(queue) or rules.get("*") or IdlePolicy()


def parse_idle_reclaim(text: str) -> dict[str, IdlePolicy]:
    """`queue=never|after:SECONDS|waiting:SECONDS,...` (`*` for every other queue); ValueError names the entry."""
    policies: dict[str, IdlePolicy] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        queue, _, rule = entry.partition("=")
        mode, _, seconds = rule.partition(":")
        if not queue or mode not in IDLE_MODES:
            raise ValueError(f"{entry!r}: expected queue=never|after:SECONDS|waiting:SECONDS")
        if mode == "never":
            policies[queue] = IdlePolicy()
            continue
        try:
            idle_s = float(seconds)
        except ValueError:
            raise ValueError(f"{entry!r}: expected a number of seconds after {mode}:") from None
        if not idle_s >= 0:
            raise ValueError(f"{entry!r}: seconds must be >= 0")
        policies[queue] = IdlePolicy(mode, idle_s)
    return policies
