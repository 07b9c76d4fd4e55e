"""Every way in that is not a gRPC call, fuzzed: each topic's event decoder (payload and CloudEvents headers),
trace files, queue and token files, the services' environment, the agent's recordings, DCGM exporter pages.
No exception but the documented one, and that one names the field, header, column, variable or line."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.entry_points import EntryPoint, entry_points
from tests.fuzz.oracle import Tally

EXAMPLES = int(os.environ.get("KUMIKI_FUZZ_EXAMPLES", "100"))
HANG_S = 2.0  # one input taking longer than this is a hang (every one of these is a pure function of one input)
POINTS = {point.name: point for point in entry_points()}


@pytest.mark.parametrize("name", list(POINTS))
def test_every_entry_point_accepts_or_rejects_naming_the_field(name: str) -> None:
    point: EntryPoint = POINTS[name]
    tally = Tally(name)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(point.inputs)
    def one(value: object) -> None:
        started = time.perf_counter()
        outcome = point.run(value)
        if time.perf_counter() - started > HANG_S:
            outcome = "hang"
        tally.add(outcome, repr(value)[:300].encode())
        assert not outcome.startswith("crash") and outcome != "hang", f"{outcome} for {value!r:.300}"

    one()
    assert tally.outcomes["rejected-field"] > 0, tally.outcomes  # the inputs reached the validation
