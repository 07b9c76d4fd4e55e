"""Queue state: borrowed and lent GPUs per queue."""

from __future__ import annotations

import pytest

from kumiki.quota.core import Holding, queue_statuses
from tests.quota.core.helpers import small_config


def test_queue_status_reports_borrowed_and_lent() -> None:
    config = small_config()  # 10 GPUs, guarantees a 4, b 4 (2 unguaranteed)
    held = [Holding("root/a", 1), Holding("root/batch", 5, borrowed=True)]
    statuses = {s.queue: s for s in queue_statuses(config, held)}
    assert statuses["root/batch"].borrowed_gpus == 5
    # 5 borrowed: 2 from unguaranteed capacity, 3 from the 3 + 4 unused guarantee of a and b
    assert statuses["root/a"].lent_gpus + statuses["root/b"].lent_gpus == pytest.approx(3.0)
    assert statuses["root/a"].lent_gpus == pytest.approx(3.0 * 3 / 7)
    assert statuses["root"].used_gpus == 6
