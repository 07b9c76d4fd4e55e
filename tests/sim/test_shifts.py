import dataclasses
import re

import pytest

from kumiki.sim.shifts import (
    NEW_QUEUE,
    RUN_TIME_FACTOR,
    SHIFTS,
    ShiftError,
    day_orders,
    parse_day_order,
    reorder_days,
    shift_trace,
)
from kumiki.sim.trace import TraceJob


def job(index: int, queue: str, submit_s: float | None, duration_s: float | None = 100.0) -> TraceJob:
    return TraceJob(f"j{index}", submit_s, 1.0, None, None, duration_s, "u", queue, "", "")


# "a" is the busiest queue, "b" the second; submits span 0..1000, so the middle is 500
TRACE = [
    job(0, "a", 0.0),
    job(1, "b", 100.0),
    job(2, "a", 400.0),
    job(3, "c", 450.0),
    job(4, "a", 500.0),
    job(5, "b", 700.0),
    job(6, "a", 900.0, None),
    job(7, "a", 1000.0),
    job(8, "b", None),
]


def test_x10_lengthens_only_the_busiest_queues_jobs_from_the_middle_on():
    shift = shift_trace(TRACE, "x10")
    assert (shift.queue, shift.from_s) == ("a", 500.0)
    assert shift.changed == {"j4", "j7"}  # j6 has no run time to scale
    for new, old in zip(shift.jobs, TRACE, strict=True):
        if new.job_id in {"j4", "j7"}:
            assert new.duration_s == old.duration_s * RUN_TIME_FACTOR
            assert new.queue == old.queue and new.submit_s == old.submit_s
        else:  # j6 included: a job without a run time stays as it is
            assert new == old
    assert "queue 'a'" in shift.describe() and "x10" in shift.describe()


def test_new_vc_renames_the_second_busiest_queue_from_the_middle_on():
    shift = shift_trace(TRACE, "new-vc")
    assert shift.queue == "b" and shift.target == NEW_QUEUE and shift.changed == {"j5"}
    renamed = {each.job_id: each for each in shift.jobs}
    assert renamed["j5"].queue == NEW_QUEUE and renamed["j5"].duration_s == 100.0
    assert renamed["j1"].queue == "b" and renamed["j8"].queue == "b"  # before the middle, or never submitted
    assert [each.job_id for each in shift.jobs] == [each.job_id for each in TRACE]


@pytest.mark.parametrize(
    ("jobs", "name", "message"),
    [
        (TRACE, "x100", "unknown shift 'x100' (known: x10, new-vc)"),
        ([job(0, "a", None)], "x10", "no submit times"),
        ([job(0, "a", 0.0), job(1, "a", 10.0)], "new-vc", "needs at least 2 queue(s); the trace has 1"),
        ([job(0, "a", 0.0), job(1, NEW_QUEUE, 10.0)], "new-vc", "which the trace already has"),
    ],
)
def test_a_shift_that_cannot_apply_says_why(jobs, name, message):
    with pytest.raises(ShiftError, match=re.escape(message)):
        shift_trace(jobs, name)


@pytest.mark.parametrize("name", SHIFTS)
def test_every_named_shift_changes_jobs_and_keeps_the_rest(name):
    shift = shift_trace(TRACE, name)
    assert shift.changed
    assert [each for each in shift.jobs if each.job_id not in shift.changed] == [
        each for each in TRACE if each.job_id not in shift.changed
    ]


# ---- another week from this one's days ------------------------------------------------------------------
DAY = 86_400.0
WEEK = [
    job(0, "a", 1 * DAY + 10.0),  # the trace's day 0 is UTC day 1
    job(1, "b", 1 * DAY + 50_000.0),
    job(2, "a", 2 * DAY + 20.0),
    job(3, "c", 3 * DAY + 30.0, 500.0),
    job(4, "b", None),
]


def test_reordered_days_keep_each_jobs_time_of_day_and_everything_else():
    reordered = reorder_days(WEEK, [2, 0, 1])
    by_id = {each.job_id: each for each in reordered}
    assert [each.job_id for each in reordered] == ["j3", "j0", "j1", "j2", "j4"]
    assert by_id["j3"].submit_s == 1 * DAY + 30.0  # day 2 comes first
    assert (by_id["j0"].submit_s, by_id["j1"].submit_s) == (2 * DAY + 10.0, 2 * DAY + 50_000.0)
    assert by_id["j2"].submit_s == 3 * DAY + 20.0
    assert by_id["j4"].submit_s is None
    for new in reordered:
        old = next(each for each in WEEK if each.job_id == new.job_id)
        assert new == dataclasses.replace(old, submit_s=new.submit_s)


def test_the_identity_order_gives_the_trace_back():
    assert reorder_days(WEEK, [0, 1, 2]) == WEEK


@pytest.mark.parametrize("order", [[0, 1], [0, 1, 1], [1, 2, 3], [0, 1, 2, 3]])
def test_an_order_that_is_not_a_permutation_of_the_days_is_refused(order):
    with pytest.raises(ShiftError, match=re.escape(f"day order {order} must list each of the trace's 3 days")):
        reorder_days(WEEK, order)


def test_day_orders_are_distinct_never_the_traces_own_and_repeatable():
    orders = day_orders(7, 9, seed=0)
    assert len(set(orders)) == 9 and tuple(range(7)) not in orders
    assert all(sorted(order) == list(range(7)) for order in orders)
    assert day_orders(7, 9, seed=0) == orders and day_orders(7, 9, seed=1) != orders
    assert len(day_orders(3, 10)) == 5  # only 3! - 1 other orders exist
    assert day_orders(1, 3) == []


def test_a_day_order_from_the_command_line_is_parsed_or_refused_naming_the_form():
    assert parse_day_order("3,0,1,2") == [3, 0, 1, 2]
    with pytest.raises(ShiftError, match="comma-separated day numbers"):
        parse_day_order("3,zero,1")
