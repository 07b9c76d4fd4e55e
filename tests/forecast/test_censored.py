import math

import pytest

from kumiki.forecast.models import DEFAULT_SELECTION, WeightedSelection
from kumiki.forecast.models.censored import CensoredHistory, kaplan_meier_median, kaplan_meier_quantiles
from kumiki.forecast.models.experts import HistoryMedianForecaster
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast, tell_started, tell_stopped
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator


def job(job_id: str, submit_s: float, queue: str = "vc", gpus: float = 1.0) -> JobFeatures:
    return JobFeatures(job_id=job_id, queue=queue, user="", gpus=gpus, name="", submit_s=submit_s)


def test_kaplan_meier_median_without_censoring_is_the_lower_median():
    assert kaplan_meier_median([(value, True) for value in (4.0, 1.0, 3.0, 2.0)]) == 2.0
    assert kaplan_meier_median([(value, True) for value in (5.0, 1.0, 3.0)]) == 3.0


def test_kaplan_meier_median_is_not_pulled_down_by_runs_that_just_started():
    # two runs censored early say nothing against the finished ones: the median of the exact values stands
    samples = [(0.1, False), (0.2, False), (1.0, True), (2.0, True), (3.0, True)]
    assert kaplan_meier_median(samples) == 2.0


def test_kaplan_meier_median_is_unknown_while_most_runs_outlast_every_end():
    assert kaplan_meier_median([(1.0, True), (3.0, False), (3.5, False), (4.0, False)]) is None
    # a censored run tied with an event is still at risk at it (the event comes first)
    assert kaplan_meier_median([(1.0, True), (1.0, False), (2.0, True)]) == 2.0


def run_and_finish(expert: CensoredHistory, job_id: str, at_s: float, runtime_s: float) -> None:
    features = job(job_id, at_s)
    expert.predict(features)
    tell_started(expert, job_id, at_s)
    expert.observe(features, runtime_s, at_s + runtime_s)


def test_a_sweep_of_long_runs_is_seen_while_it_runs():
    censored, rolling = CensoredHistory(), HistoryMedianForecaster(window=100)
    for index in range(30):  # the key's usual runs: ~1,000 s
        at = index * 1_000.0
        run_and_finish(censored, f"short-{index}", at, 1_000.0 + index)
        rolling.observe(job(f"short-{index}", at), 1_000.0 + index, at + 1_000.0 + index)
    sweep_start = 40_000.0
    for index in range(40):  # a sweep starts and runs on
        censored.predict(job(f"sweep-{index}", sweep_start))
        tell_started(censored, f"sweep-{index}", sweep_start)
    later = job("next", sweep_start + 20_000.0)  # 20x the usual run time later, none of the sweep has ended
    assert rolling.predict(later).p50_s == pytest.approx(1_015.0, rel=0.02)
    forecast = censored.predict(later)
    # more than half of the key's last 70 started runs are past 20,000 s: the median is at least that
    assert forecast.p50_s == pytest.approx(20_000.0)
    # a moment after the sweep started it still says what the finished runs say
    assert censored.predict(job("early", sweep_start + 10.0)).p50_s == pytest.approx(1_015.0, rel=0.05)


def test_a_stopped_run_does_not_age_while_it_waits():
    expert = CensoredHistory(min_count=1)
    run_and_finish(expert, "done", 0.0, 100.0)
    for job_id in ("a", "b"):
        expert.predict(job(job_id, 0.0))
        tell_started(expert, job_id, 0.0)
        tell_stopped(expert, job_id, 50.0)  # preempted after 50 s, waiting ever since
    # runs of 100 s, >= 50 s and >= 50 s: the median is 100 s however long a and b wait
    assert expert.predict(job("probe", 100_000.0)).p50_s == pytest.approx(100.0)
    tell_started(expert, "a", 100_000.0)
    tell_started(expert, "b", 100_000.0)
    # resumed: 50 s banked + 1,000 s since each restart, so both outlast the finished run
    assert expert.predict(job("probe-2", 101_000.0)).p50_s == pytest.approx(1_050.0)


def test_memory_is_bounded_by_the_window():
    expert = CensoredHistory(window=10)
    for index in range(500):
        run_and_finish(expert, f"j{index}", float(index), 10.0)
    # every job is in the lanes of its three key levels (queue+gpus, queue, all): the last ten of each remain
    assert len(expert.started_lanes.members) == 10
    assert all(len(lane) == 10 for lane in expert.started_lanes.lanes.values())
    expert.predict(job("never-started", 600.0))
    assert "never-started" not in expert.started_lanes.members  # nothing kept for a job until it starts


def test_a_new_key_with_its_first_runs_going_long_is_at_least_that_long():
    expert = CensoredHistory()
    for index in range(20):
        run_and_finish(expert, f"other-{index}", float(index), 600.0)
    for index in range(5):
        expert.predict(job(f"new-{index}", 1_000.0, queue="new"))
        tell_started(expert, f"new-{index}", 1_000.0)
    forecast = expert.predict(job("new-next", 31_000.0, queue="new"))
    # nothing of the new queue has finished; its five runs are 30,000 s along already
    assert forecast.p50_s == pytest.approx(30_000.0)
    assert forecast.p50_s > 600.0


def test_the_selection_passes_starts_and_stops_to_the_censored_expert():
    assert "history-censored" in DEFAULT_SELECTION  # weighed by default since the record counts running jobs
    selection = WeightedSelection()
    censored = selection.experts["history-censored"]
    assert isinstance(censored, CensoredHistory)
    selection.predict(job("a", 0.0))
    tell_started(selection, "a", 10.0)
    tell_stopped(selection, "a", 70.0)
    assert censored.started_lanes.members["a"].clock.banked_s == pytest.approx(60.0)
    assert censored.started_lanes.members["a"].clock.since_s is None


class Listening:
    """Records every start and stop the simulator tells it (and forecasts a fixed 100 s)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, float]] = []

    def predict(self, features: JobFeatures) -> RuntimeForecast:
        return RuntimeForecast(100.0, 400.0, "fixed", 1, log_sigma=1.0)

    def observe(self, features: JobFeatures, runtime_s: float, finished_s: float) -> None:
        self.heard.append(("end", features.job_id, finished_s))

    def started(self, job_id: str, start_s: float) -> None:
        self.heard.append(("start", job_id, start_s))

    def stopped(self, job_id: str, stop_s: float) -> None:
        self.heard.append(("stop", job_id, stop_s))


def test_the_simulator_tells_every_start_and_every_preemption():
    # one GPU: a long job runs, a much shorter one arrives and preempts it (the forecast says 100 s for both, so
    # the long one, having run past it, ranks worse)
    jobs = [SimJobSpec("long", 0.0, 1, 20_000.0), SimJobSpec("short", 10_000.0, 1, 50.0)]
    listening = Listening()
    result = Simulator(uniform_cluster(1, 1), jobs, SimConfig(POLICIES["kumiki"]), forecaster=listening).run()
    preemptions = {record.job_id: record.preemptions for record in result.jobs}
    assert preemptions == {"long": 1, "short": 0}
    kinds = [(kind, job_id) for kind, job_id, _ in listening.heard]
    assert kinds == [
        ("start", "long"),
        ("stop", "long"),
        ("start", "short"),
        ("end", "short"),
        ("start", "long"),
        ("end", "long"),
    ]
    stop_at = next(at for kind, job_id, at in listening.heard if kind == "stop")
    assert stop_at == pytest.approx(10_000.0)
    assert math.isfinite(stop_at)


def test_kaplan_meier_quantiles_without_censoring_are_the_order_statistics() -> None:
    values = [(float(value), True) for value in range(1, 11)]
    assert kaplan_meier_quantiles(values, (0.1, 0.5, 0.9)) == [1.0, 5.0, 9.0]
    # runs still going past every end leave the upper quantiles unknown, not short
    censored = [(1.0, True), (2.0, True), *((3.0, False),) * 8]
    assert kaplan_meier_quantiles(censored, (0.1, 0.5)) == [1.0, None]
