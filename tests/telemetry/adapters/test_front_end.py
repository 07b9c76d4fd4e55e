"""Flow control between stage 1 and this worker's stage 2, without a broker (the aiokafka front end itself runs in
test_end_to_end.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kumiki.telemetry.adapters.front_end import FlowControl


async def test_flow_control_waits_for_this_workers_stage_2_only() -> None:
    flow = FlowControl(batch_window_s=0.01)
    loop = asyncio.get_running_loop()

    def sent(partition: int, offset: int) -> list[asyncio.Future[Any]]:
        future: asyncio.Future[Any] = loop.create_future()
        future.set_result(SimpleNamespace(partition=partition, offset=offset))
        return [future]

    await flow.wait(sent(2, 9))  # a partition stage 2 here never folded: another worker's
    assert flow.waits == 0

    flow.fold(0, 3)
    waiting = asyncio.create_task(flow.wait(sent(0, 5)))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # stage 2 is at offset 3 of partition 0, the batch ended at 5
    flow.fold(0, 5)
    await asyncio.wait_for(waiting, 1)
    assert flow.waits == 1

    flow.fold(1, 0)
    waiting = asyncio.create_task(flow.wait(sent(1, 7)))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await flow.forget(set())  # a rebalance: this worker may no longer hold partition 1
    await asyncio.wait_for(waiting, 1)
