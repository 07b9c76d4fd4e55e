import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.sched.jobs import CheckpointModel, GangRequest, PodRequest, RequestError, consolidated_gang


def test_consolidated_shape():
    assert [pod.gpus for pod in consolidated_gang("a", 3, 8).pods] == [3]
    assert [pod.gpus for pod in consolidated_gang("b", 16, 8).pods] == [8, 8]
    assert [pod.gpus for pod in consolidated_gang("c", 12, 8).pods] == [8, 8]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpus": -1}, "gpus"),
        ({"gpu_fraction": 1.5}, "gpu_fraction"),
        ({"gpus": 1, "gpu_fraction": 0.5}, "not several"),
        ({"gpus": 1, "mig_profile": "1g.5gb"}, "not several"),
        ({"cpu_milli": -5}, "cpu_milli"),
    ],
)
def test_bad_pod_requests_name_the_field(kwargs, field):
    with pytest.raises(RequestError, match=field):
        PodRequest(**kwargs)


def test_bad_gangs():
    with pytest.raises(RequestError, match="at least one pod"):
        GangRequest("a", ())
    with pytest.raises(RequestError, match="min_members"):
        GangRequest("a", (PodRequest(gpus=1),), min_members=2)


def test_checkpoint_model_defaults_and_loss():
    model = CheckpointModel()
    assert (model.interval_s, model.checkpoint_cost_s, model.restore_cost_s) == (1800.0, 60.0, 60.0)
    assert model.lost_progress(2000.0) == pytest.approx(200.0)
    assert model.lost_progress(1799.0) == pytest.approx(1799.0)
    # 4000 s of progress crosses two checkpoints: 2 x 60 s of stops
    assert model.wall_time(0.0, 4000.0) == pytest.approx(4120.0)
    # finishing exactly at a checkpoint boundary writes no final checkpoint
    assert model.wall_time(0.0, 3600.0) == pytest.approx(3660.0)


@settings(max_examples=60, deadline=None)
@given(
    start=st.floats(0, 20000),
    wall=st.floats(0, 50000),
    interval=st.floats(100, 5000),
    cost=st.floats(0, 300),
)
def test_progress_after_inverts_wall_time(start, wall, interval, cost):
    model = CheckpointModel(interval, cost, 60.0)
    progress = model.progress_after(start, wall)
    assert start <= progress <= start + wall + 1e-6
    # the wall time needed to reach that progress never exceeds the wall time spent
    assert model.wall_time(start, progress) <= wall + cost + 1e-6
