"""Every way in that is not a gRPC call, fuzzed: each topic's event decoder (payload and CloudEvents headers),
trace files, queue and token files, the services' environment, the agent's recordings, DCGM exporter pages, and
the Kubernetes pods the binder reads.
No exception but the documented one, and that one names the field, header, column, variable or line."""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.entry_points import EntryPoint, entry_points
from tests.fuzz.oracle import Tally

EXAMPLES = int(os.environ.get("KUMIKI_FUZZ_EXAMPLES", "60"))
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


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("quota tokens file", '"\\U8002D507": 1'),  # PyYAML: OverflowError from chr()
        ("quota tokens file", '- "\\U0001F1FA\\U0001F1F8": null\n"\\x17": \\U00110000'),
        ("trace file (jobs)", b"submit_s,gpus,cpus,mem_gb,duration_s,user,queue,status,model,extra\xff\xfe"),
        ("service environment", {"KUMIKI_KAFKA_SASL_PASSWORD_FILE": "x" * 300}),  # ENAMETOOLONG
    ],
)
def test_what_the_fuzzing_found_stays_fixed(name: str, value: object) -> None:
    assert POINTS[name].run(value) == "rejected-field"


def test_a_dcgm_page_with_infinite_memory_is_read_not_crashed() -> None:
    labels = '{gpu="0",UUID="GPU-1",Hostname="n1"}'
    page = f"DCGM_FI_DEV_FB_USED{labels} +Inf\nDCGM_FI_DEV_FB_FREE{labels} 1"
    assert POINTS["dcgm exporter page"].run(page) in ("accepted", "rejected-field")
