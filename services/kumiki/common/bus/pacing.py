"""Empty fetches a broker answers at once are paced here, so an idle consumer does not spin.

A Kafka broker holds an empty fetch until data arrives or `fetch_max_wait_ms` (500 ms) passes, so an idle
consumer sends about two fetches a second. A broker that answers empty fetches at once (the development broker,
noida-db 0.2.3) makes aiokafka's fetcher send the next one at once: about 1,500 fetches a second per consumer,
a third of a core per idle service. Where an empty answer comes back sooner than the wait the fetch asked for,
the fetcher now waits out the rest itself, up to `pause_s`: a broker that long-polls never meets the pause,
one that does not gets at most 1 / `pause_s` empty fetches a second per broker, and a record arriving meanwhile
is read at most `pause_s` late.

aiokafka has no hook for this, so the one method that sends a fetch (`Fetcher._proc_fetch_request`, aiokafka
0.14; the wait asked is the fetcher's `_fetch_max_wait_ms`) is wrapped once per process; every consumer in the
process (ours, faust's) goes through it. Without that method (another aiokafka) nothing is wrapped and a warning
says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.consumer import fetcher as aiokafka_fetcher

log = logging.getLogger(__name__)

DEFAULT_FETCH_MAX_WAIT_MS = 500  # aiokafka's and the Java client's default
_pause_s = 0.0
_PACED_MARK = "_kumiki_paced"


def remaining_pause(asked_wait_s: float, answered_after_s: float, pause_s: float) -> float:
    """How long to wait after an empty fetch answered after `answered_after_s`: none if the broker long-polled."""
    if pause_s <= 0.0 or answered_after_s >= asked_wait_s:
        return 0.0
    return min(pause_s, asked_wait_s - answered_after_s)


def pace_empty_fetches(pause_s: float) -> bool:
    """Pace empty fetches answered early in this process by up to `pause_s` (0: no pacing); True if in force."""
    global _pause_s
    _pause_s = max(0.0, pause_s)
    fetcher_class: Any = aiokafka_fetcher.Fetcher
    send_fetch = getattr(fetcher_class, "_proc_fetch_request", None)
    if send_fetch is None:
        log.warning("aiokafka's fetcher has no _proc_fetch_request: empty fetches are not paced")
        return False
    if not getattr(send_fetch, _PACED_MARK, False):
        fetcher_class._proc_fetch_request = _paced(send_fetch)
    return _pause_s > 0.0


def _paced(send_fetch: Callable[..., Awaitable[bool]]) -> Callable[..., Awaitable[bool]]:
    @functools.wraps(send_fetch)
    async def paced(self: Any, assignment: Any, node_id: int, request: Any) -> bool:
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        has_new_data = await send_fetch(self, assignment, node_id, request)
        if not has_new_data and _pause_s > 0.0:
            asked_wait_s = getattr(self, "_fetch_max_wait_ms", DEFAULT_FETCH_MAX_WAIT_MS) / 1000.0
            wait_s = remaining_pause(asked_wait_s, loop.time() - sent_at, _pause_s)
            if wait_s > 0.0:
                # the node stays "in flight" meanwhile: no other fetch goes to it. close() and a lost assignment
                # cancel this task and await it, expecting it to end quietly, as aiokafka's own fetch does
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(wait_s)
        return has_new_data

    setattr(paced, _PACED_MARK, True)
    return paced
