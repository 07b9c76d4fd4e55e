"""Progress under periodic checkpoints that stop below `until_s`: wall time, its inverse, the last checkpoint."""

from __future__ import annotations

import math

import pytest

from kumiki.sched.jobs import CheckpointModel
from kumiki.sim.progress import last_checkpoint, progress_after, run_wall

EVERY_100 = CheckpointModel(interval_s=100.0, checkpoint_cost_s=10.0, restore_cost_s=5.0)


def test_a_run_pays_for_the_checkpoints_it_writes_below_until_and_none_past_it() -> None:
    assert run_wall(EVERY_100, 0.0, 350.0, math.inf) == 350.0 + 3 * 10.0  # at 100, 200 and 300
    assert run_wall(EVERY_100, 0.0, 350.0, 250.0) == 250.0 + 2 * 10.0 + 100.0  # none past 250
    assert run_wall(EVERY_100, 300.0, 350.0, 250.0) == 50.0  # started past it: plain time
    assert run_wall(EVERY_100, 0.0, 200.0, math.inf) == 200.0 + 10.0  # none written as it finishes


@pytest.mark.parametrize("until_s", [math.inf, 250.0, 0.0])
@pytest.mark.parametrize("end_s", [50.0, 100.0, 240.0, 260.0, 999.0])
def test_progress_after_is_the_inverse_of_run_wall(until_s: float, end_s: float) -> None:
    wall = run_wall(EVERY_100, 30.0, end_s, until_s)
    assert progress_after(EVERY_100, 30.0, wall, until_s) == pytest.approx(end_s)


def test_a_run_stopped_while_writing_a_checkpoint_has_reached_it() -> None:
    assert progress_after(EVERY_100, 0.0, 105.0, math.inf) == 100.0


def test_the_last_checkpoint_is_the_one_below_the_progress_and_below_until() -> None:
    assert last_checkpoint(EVERY_100, 250.0, math.inf) == 200.0
    assert last_checkpoint(EVERY_100, 420.0, 250.0) == 200.0  # none written past 250
    assert last_checkpoint(EVERY_100, 420.0, 300.0) == 200.0  # 300 itself is not below 300
    assert last_checkpoint(EVERY_100, 90.0, math.inf) == 0.0


def test_with_the_default_model_every_start_end_and_until_inverts() -> None:
    model = CheckpointModel()
    for start in (0.0, 900.0, 1800.0, 5000.0):
        for end in (start + 10.0, 3600.0 + start, 9000.0, 20_000.0):
            for until in (0.0, 3600.0, 9000.0, math.inf):
                if end <= start:
                    continue
                wall = run_wall(model, start, end, until)
                assert wall >= end - start
                assert progress_after(model, start, wall, until) == pytest.approx(end)


def test_a_full_node_job_preempted_past_until_keeps_the_checkpoint_before_it() -> None:
    model = CheckpointModel()  # every 1,800 s
    assert last_checkpoint(model, 8000.0, 9000.0) == 7200.0
    assert last_checkpoint(model, 50_000.0, 9000.0) == 7200.0
    assert last_checkpoint(model, 4000.0, math.inf) == 3600.0
