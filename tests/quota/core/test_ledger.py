"""Ledger arithmetic: one metered interval per generation, exact GPU-seconds, teams."""

from __future__ import annotations

from decimal import Decimal

from kumiki.quota.core import (
    Effect,
    Ledger,
    LifecycleState,
    gpu_seconds,
    lifecycle_effect,
    overlap_micros,
    team_of,
    timestamp_micros,
)


def test_ledger_meters_from_running_to_stop_exactly_once() -> None:
    ledger = Ledger()
    base = timestamp_micros(1_700_000_000, 0)
    running = LifecycleState.RUNNING
    common = {"queue": "q", "gpu_model": "A100", "gpus": Decimal("0.46")}
    assert ledger.apply(job_id="j", generation=1, state=running, at_us=base, **common) is None
    ledger.apply(job_id="j", generation=1, state=running, at_us=base + 5_000_000, **common)  # repeated: ignored
    entry = ledger.apply(job_id="j", generation=1, state=LifecycleState.PREEMPTED, at_us=base + 1_500_001)
    assert entry is not None and entry.gpu_seconds == Decimal("0.46") * Decimal("1.500001")
    assert ledger.apply(job_id="j", generation=1, state=LifecycleState.COMPLETED, at_us=base + 9_000_000) is None
    ledger.apply(job_id="j", generation=1, state=running, at_us=base + 9_000_000, **common)  # late replay
    assert ("j", 1) not in ledger.open
    assert ledger.apply(job_id="k", generation=1, state=LifecycleState.COMPLETED, at_us=base) is None
    assert ledger.apply(job_id="j", generation=2, state=LifecycleState.OTHER, at_us=base) is None  # RESUMED
    assert ledger.total_gpu_seconds() == Decimal("0.69000046")


def test_ledger_meters_the_allocation_from_bound_and_running_does_not_restart_it() -> None:
    """A job bound for 25 s and released as completed is billed 8 x 25 GPU-seconds (it was 0 when only RUNNING
    opened the meter); a RUNNING reported later by a cluster integration neither restarts nor doubles it."""
    ledger = Ledger()
    base = timestamp_micros(1_700_000_000, 0)
    common = {"queue": "research", "gpus": Decimal(8)}
    ledger.apply(job_id="demo", generation=1, state=LifecycleState.BOUND, at_us=base, **common)
    ledger.apply(job_id="demo", generation=1, state=LifecycleState.RUNNING, at_us=base + 3_000_000, **common)
    entry = ledger.apply(job_id="demo", generation=1, state=LifecycleState.COMPLETED, at_us=base + 25_000_000)
    assert entry is not None and entry.start_us == base and entry.gpu_seconds == Decimal(200)
    # an integration that binds outside placement reports only RUNNING: that opens the meter
    ledger.apply(job_id="ext", generation=1, state=LifecycleState.RUNNING, at_us=base, **common)
    assert ("ext", 1) in ledger.open


def test_bound_and_running_open_the_meter_endings_close_it_and_other_states_do_nothing() -> None:
    effects = {state: lifecycle_effect(state) for state in LifecycleState}
    assert effects == {
        LifecycleState.BOUND: Effect.OPEN,
        LifecycleState.RUNNING: Effect.OPEN,
        LifecycleState.COMPLETED: Effect.CLOSE,
        LifecycleState.FAILED: Effect.CLOSE,
        LifecycleState.PREEMPTED: Effect.CLOSE,
        LifecycleState.RELEASED: Effect.CLOSE,
        LifecycleState.OTHER: Effect.NONE,
    }
    ledger = Ledger()
    assert ledger.apply(job_id="j", generation=1, state=LifecycleState.OTHER, at_us=0, gpus=Decimal(1)) is None
    assert not ledger.open and not ledger.closed


def test_interval_arithmetic_is_exact_and_windows_split_intervals() -> None:
    assert timestamp_micros(10, 999_999_999) == 10_999_999
    assert gpu_seconds(Decimal("3"), 0, 1) == Decimal("0.000003")
    assert overlap_micros(0, 100, 50, 200) == 50
    assert overlap_micros(0, 100, 100, 200) == 0
    whole = gpu_seconds(Decimal("2"), 0, 7_200_000_000)
    halves = gpu_seconds(Decimal("2"), 0, 3_600_000_000) + gpu_seconds(Decimal("2"), 3_600_000_000, 7_200_000_000)
    assert whole == halves == Decimal(14_400)


def test_team_is_the_first_two_levels() -> None:
    assert team_of("acme/research/vision") == "acme/research"
    assert team_of("solo") == "solo"
