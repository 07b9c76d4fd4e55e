"""`kumiki replay`'s live view where stderr is not a terminal: lines a log can hold, and a stall that shows."""

from __future__ import annotations

from kumiki.cli.replay import LINE_EVERY_S, STILL_EVERY_S, LogLines, _line
from kumiki.replay.driver import LiveCounts


def test_a_line_when_the_counts_change_at_most_every_line_every_s() -> None:
    lines = LogLines()
    assert lines.due("a", 0.0) == "a"
    assert lines.due("b", LINE_EVERY_S / 2) is None  # changed, but too soon after the last line
    assert lines.due("b", LINE_EVERY_S) == "b"
    assert lines.due("b", LINE_EVERY_S + 1) is None  # nothing new


def test_a_stall_prints_how_long_nothing_changed() -> None:
    lines = LogLines()
    assert lines.due("a", 100.0) == "a"
    assert lines.due("a", 100.0 + STILL_EVERY_S - 1) is None
    assert lines.due("a", 100.0 + STILL_EVERY_S) == f"a (no change for {STILL_EVERY_S:.0f} s)"
    assert lines.due("a", 100.0 + 2 * STILL_EVERY_S) == f"a (no change for {2 * STILL_EVERY_S:.0f} s)"
    assert lines.due("b", 100.0 + 2 * STILL_EVERY_S + LINE_EVERY_S) == "b"  # moving again: counted from here
    assert lines.due("b", 100.0 + 3 * STILL_EVERY_S + LINE_EVERY_S) == f"b (no change for {STILL_EVERY_S:.0f} s)"


def test_the_line_carries_the_tables_counts() -> None:
    counts = LiveCounts()
    counts.start("kumiki", 12)
    counts.submitted, counts.waiting, counts.running, counts.done = 5, 2, 3, 0
    counts.gpus_allocated, counts.gpus_busy, counts.idle_found, counts.idle_reclaimed = 24, 16, 1, 1
    assert _line(counts) == (
        "replay kumiki: submitted 5/12, waiting 2, running 3, done 0; GPUs held 24, computing 16; "
        "idle jobs found 1, reclaimed 1"
    )
