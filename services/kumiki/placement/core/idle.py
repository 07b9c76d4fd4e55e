"""Idle-GPU reclaim rules per queue: what a queue does with a job whose GPUs telemetry reports idle."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """What a queue does with a job whose GPUs telemetry reports idle (kumiki.gpu.idle): `never` reclaim it,
    reclaim it `after` `idle_s` seconds idle, or only when someone `waiting` could use the GPUs."""

    mode: str = "never"
    idle_s: float = 0.0


IDLE_MODES = ("never", "after", "waiting")


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
