"""The worker's timed garbage collection: automatic collection off while it runs, back on after."""

from __future__ import annotations

import asyncio
import gc

from kumiki.telemetry.adapters.gc_policy import TimedCollection


async def test_collects_on_its_timer_and_gives_automatic_collection_back() -> None:
    assert gc.isenabled()
    collection = TimedCollection(young_every_s=0.01, full_every_s=0.03)
    collection.start()
    try:
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what was loaded before the start is out of the collector's sight
        before = gc.get_stats()[2]["collections"]
        async with asyncio.timeout(5):
            while collection.collections < 5:
                await asyncio.sleep(0.01)
        assert gc.get_stats()[2]["collections"] > before  # a full collection ran on its own timer
    finally:
        await collection.stop()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert not collection.started


async def test_stop_without_start_leaves_the_collector_alone() -> None:
    gc.disable()
    try:
        await TimedCollection().stop()
        assert not gc.isenabled()
    finally:
        gc.enable()
