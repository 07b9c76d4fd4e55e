"""Forecasts off the bus: what the placement service orders and sets its preemption margin by."""

import math

import pytest

from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2
from kumiki.common.grpcutil import InvalidRequest
from kumiki.placement.adapters.convert import bind_command, command_from_lifecycle, command_lifecycle, runtime_forecast
from kumiki.placement.core import job_view


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


def featured_request(**fields: object) -> placement_pb2.BindRequest:
    return placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="j", generation=1),
        queue="team-a",
        pods=[common_pb2.PodResources(gpus=1)],
        **fields,  # type: ignore[arg-type]
    )


def test_pod_features_reach_the_queue_policy_and_survive_a_restart() -> None:
    command = bind_command(featured_request(image="img:1", command="python train.py", time_limit_s=7200.0))
    features = job_view(command, 5.0).features
    assert (features.image, features.command, features.time_limit_s) == ("img:1", "python train.py", 7200.0)
    submitted = command_lifecycle(command, events_pb2.JOB_STATE_SUBMITTED)
    assert command_from_lifecycle(events_pb2.JobLifecycle.FromString(submitted.SerializeToString())) == command
    bare = bind_command(featured_request())
    assert (bare.image, bare.command_line, bare.time_limit_s) == ("", "", None)
    assert not command_lifecycle(bare, events_pb2.JOB_STATE_SUBMITTED).HasField("time_limit_s"), "none asked"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"time_limit_s": 0.0}, "time_limit_s"),
        ({"time_limit_s": -60.0}, "time_limit_s"),
        ({"time_limit_s": math.inf}, "time_limit_s"),
        ({"image": "x" * 5000}, "image"),
        ({"command": "y" * 5000}, "command"),
    ],
)
def test_an_unusable_pod_feature_is_refused_naming_the_field(fields: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        bind_command(featured_request(**fields))
    assert raised.value.field == field


def test_distinct_nodes_reaches_the_gang_and_survives_a_restart() -> None:
    request = featured_request(topology=common_pb2.TopologyConstraint(distinct_nodes=True))
    request.pods.append(common_pb2.PodResources(gpus=1))
    command = bind_command(request)
    assert command.request.distinct_nodes
    submitted = command_lifecycle(command, events_pb2.JOB_STATE_SUBMITTED)
    restored = command_from_lifecycle(events_pb2.JobLifecycle.FromString(submitted.SerializeToString()))
    assert restored == command and restored.request.distinct_nodes
    assert not bind_command(featured_request()).request.distinct_nodes


def test_distinct_nodes_on_one_shared_node_is_refused_naming_the_field() -> None:
    topology = common_pb2.TopologyConstraint(level=common_pb2.TOPOLOGY_LEVEL_NODE, required=True, distinct_nodes=True)
    request = featured_request(topology=topology)
    request.pods.append(common_pb2.PodResources(gpus=1))
    with pytest.raises(InvalidRequest) as raised:
        bind_command(request)
    assert raised.value.field == "topology.distinct_nodes"
    request.min_members = 1  # one pod at least: it may have the node to itself
    assert bind_command(request).request.distinct_nodes


@pytest.mark.parametrize("reason", ["Idle-Reclaim", "idle reclaim", "idle_reclaim", "-" + "x" * 64, "é"])
def test_a_release_whose_preemption_reason_is_not_a_code_is_refused_naming_the_field(reason: str) -> None:
    from kumiki.placement.adapters.convert import release_state

    request = placement_pb2.ReleaseRequest(
        job=common_pb2.JobRef(job_id="j", generation=1),
        final_state=events_pb2.JOB_STATE_PREEMPTED,
        preemption_reason=reason,
    )
    with pytest.raises(InvalidRequest, match="preemption_reason"):
        release_state(request)
    request.preemption_reason = "idle-reclaim"
    assert release_state(request) == events_pb2.JOB_STATE_PREEMPTED
