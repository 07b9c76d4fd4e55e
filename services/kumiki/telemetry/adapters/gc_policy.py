"""The worker process's garbage collection: on a timer instead of on allocation counts.

CPython's cycle collector runs a young collection every 700 container allocations and scans every
tracked object that is still alive. A stage-1 batch keeps tens of thousands of consumed records, their
header tuples and their readings alive while it is decoded, and the tables keep every node's record and
windows, so the default collector scanned the same live objects again and again, and promoted them into
the old generation, whose full collections then scanned the tables (tenths of a second each). Measured on
a catch-up of 2,500 nodes x 8 GPUs x 10 ticks: about 30 % of the worker's CPU went to the collector.

Almost nothing the worker allocates is cyclic (reference counting frees it), so automatic collection is
turned off; a timer collects the young generations every `young_every_s` and everything every
`full_every_s`, which bounds what cyclic garbage can accumulate. `gc.freeze()` at start moves what was
loaded and recovered until then (modules, faust, the recovered tables) out of the collector's sight.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

YOUNG_EVERY_S = 5.0
FULL_EVERY_S = 600.0


class TimedCollection:
    """Start with `start()` once the worker is up; `stop()` gives automatic collection back."""

    def __init__(self, young_every_s: float = YOUNG_EVERY_S, full_every_s: float = FULL_EVERY_S) -> None:
        self.young_every_s = young_every_s
        self.full_every_s = full_every_s
        self.collections = 0
        self._task: asyncio.Task[None] | None = None
        self._was_enabled = True

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._was_enabled = gc.isenabled()
        gc.disable()
        gc.freeze()
        self._task = asyncio.create_task(self._run(), name="telemetry-gc")

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        gc.unfreeze()
        if self._was_enabled:
            gc.enable()

    async def _run(self) -> None:
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(self.young_every_s)
            if time.monotonic() - last_full >= self.full_every_s:
                gc.collect()
                last_full = time.monotonic()
            else:
                gc.collect(1)
            self.collections += 1
