"""Forecasts off the bus: what the placement service orders and sets its preemption margin by."""

import math

import pytest

from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.common.grpcutil import InvalidRequest
from kumiki.placement.adapters.convert import runtime_forecast


def message(**fields: float) -> events_pb2.RuntimeForecast:
    values = {"p50_s": 600.0, "p90_s": 2400.0, **fields}
    return events_pb2.RuntimeForecast(
        job=common_pb2.JobRef(job_id="j", generation=1), model="m", model_version=3, **values
    )


def test_both_spreads_come_through_and_unset_ones_stay_unknown() -> None:
    full = runtime_forecast(message(log_sigma=0.4, error_sigma=0.9))
    assert (full.p50_s, full.p90_s, full.model, full.model_version) == (600.0, 2400.0, "m", 3)
    assert (full.log_sigma, full.error_sigma) == (0.4, 0.9)
    bare = runtime_forecast(message())
    assert (bare.log_sigma, bare.error_sigma) == (None, None)
    # zero is a value (a key forecast exactly so far), not "unset"
    assert runtime_forecast(message(error_sigma=0.0)).error_sigma == 0.0
    # crossed quantiles (two quantile regressions) are kept as sent: the policies read max(p50, p90)
    assert runtime_forecast(message(p90_s=300.0)).p90_s == 300.0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"p50_s": 0.0}, "p50_s"),
        ({"p50_s": math.nan}, "p50_s"),
        ({"p90_s": math.inf}, "p90_s"),
        ({"log_sigma": -0.1}, "log_sigma"),
        ({"error_sigma": math.nan}, "error_sigma"),
        ({"error_sigma": math.inf}, "error_sigma"),
    ],
)
def test_a_forecast_that_could_not_order_a_queue_is_refused_naming_the_field(
    fields: dict[str, float], field: str
) -> None:
    with pytest.raises(InvalidRequest) as error:
        runtime_forecast(message(**fields))
    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: must be")
