"""Prometheus helpers shared by every service."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def labelled(family: Any, *values: str) -> Any:
    """A metric family's child for these label values, looked up once: prometheus_client's `labels()` costs
    more than the increment or observation on hot paths (a publish, a consumed event, a bind, a folded chunk).
    Only for series that are never removed (`family.remove` would leave a stale child here)."""
    return family.labels(*values)
