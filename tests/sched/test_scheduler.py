import dataclasses
import math

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import JobView, OracleJobView, consolidated_gang
from kumiki.sched.policies import KUMIKI_PROTECT_AFTER_S, POLICIES, QueuePolicy, policy_named
from kumiki.sched.scheduler import Scheduler

# kumiki's forecast backfill onto reserved nodes (it reserves for starving jobs), exercised here with
# a reservation for every blocked head so the situations are small
RESERVING_KUMIKI = dataclasses.replace(POLICIES["kumiki"], reserve=True)


def view(job_id: str, gpus: int, submit: float = 0.0, p90: float | None = None, queue: str = "q") -> JobView:
    forecast = RuntimeForecast(p90 / 2, p90, "test", 0) if p90 is not None else None
    return JobView(JobFeatures(job_id, queue, "", float(gpus), "", submit), gpus, queue, submit, forecast=forecast)


def started(decisions) -> list[str]:
    return [start.job_id for start in decisions.starts]


def two_busy_nodes(policy: str | QueuePolicy) -> Scheduler:
    """Node 0 runs A (3 of 4 GPUs), node 1 runs D (2 of 4); then B (4 GPUs) queues first."""
    chosen = policy_named(policy) if isinstance(policy, str) else policy
    scheduler = Scheduler(chosen, ClusterState.empty(uniform_cluster(2, 4)), "best-fit")
    scheduler.submit(view("A", 3, 0.0, p90=1000.0), consolidated_gang("A", 3, 4))
    assert started(scheduler.schedule(0.0)) == ["A"]
    scheduler.submit(view("D", 2, 0.0, p90=1000.0), consolidated_gang("D", 2, 4))
    assert started(scheduler.schedule(0.0)) == ["D"]
    assert scheduler.running["A"].nodes == (0,) and scheduler.running["D"].nodes == (1,)
    scheduler.submit(view("B", 4, 1.0, p90=100.0), consolidated_gang("B", 4, 4))
    return scheduler


def test_fifo_blocks_behind_the_head():
    scheduler = two_busy_nodes("fifo")
    scheduler.submit(view("C", 1, 2.0), consolidated_gang("C", 1, 4))
    assert started(scheduler.schedule(2.0)) == []


def test_fifo_backfill_never_uses_the_reserved_node():
    scheduler = two_busy_nodes("fifo-backfill")
    scheduler.submit(view("C", 2, 2.0), consolidated_gang("C", 2, 4))  # fits only node 1
    scheduler.submit(view("E", 1, 3.0), consolidated_gang("E", 1, 4))  # fits node 0
    decisions = scheduler.schedule(3.0)
    assert scheduler.reservation is not None and scheduler.reservation.job_id == "B"
    assert scheduler.reservation.nodes == frozenset({1})
    assert started(decisions) == ["E"]
    assert scheduler.running["E"].nodes == (0,)
    reason = scheduler.explain("C")
    assert reason is not None and reason.resource == "reservation"


def test_forecast_backfill_only_when_it_ends_before_the_reservation():
    scheduler = two_busy_nodes(RESERVING_KUMIKI)
    scheduler.submit(view("long", 2, 2.0, p90=5000.0), consolidated_gang("long", 2, 4))
    scheduler.submit(view("short", 2, 3.0, p90=500.0), consolidated_gang("short", 2, 4))
    decisions = scheduler.schedule(3.0)
    reservation = scheduler.reservation
    assert reservation is not None and reservation.job_id == "B" and reservation.nodes == frozenset({1})
    assert reservation.shadow_s == 1000.0  # D's p90 end
    assert [(s.job_id, s.borrower) for s in decisions.starts] == [("short", True)]
    assert "long" in scheduler.waiting


def test_reservation_deadline_evicts_an_overstaying_borrower():
    scheduler = two_busy_nodes(RESERVING_KUMIKI)
    scheduler.submit(view("short", 2, 3.0, p90=500.0), consolidated_gang("short", 2, 4))
    scheduler.schedule(3.0)
    scheduler.finished("D")  # D leaves at its forecast; the borrower did not
    decisions = scheduler.schedule(1000.0)
    assert [p.job_id for p in decisions.preemptions] == ["short"]
    assert decisions.preemptions[0].reason == "reservation deadline"
    assert started(decisions) == ["B"]
    assert scheduler.state.audit() == []


def oracle(job_id: str, gpus: int, submit: float, remaining: float) -> OracleJobView:
    return OracleJobView(
        JobFeatures(job_id, "q", "", float(gpus), "", submit), gpus, "q", submit, remaining_s=remaining
    )


def test_srtf_oracle_preempts_the_longest_remaining_job():
    scheduler = Scheduler(POLICIES["srtf-oracle"], ClusterState.empty(uniform_cluster(1, 2)), "best-fit")
    scheduler.submit(oracle("long", 1, 0.0, 100_000.0), consolidated_gang("long", 1, 2))
    scheduler.submit(oracle("mid", 1, 0.0, 50_000.0), consolidated_gang("mid", 1, 2))
    scheduler.schedule(0.0)
    scheduler.submit(oracle("short", 1, 5000.0, 100.0), consolidated_gang("short", 1, 2))
    decisions = scheduler.schedule(5000.0, consider_preemption=True)
    assert [p.job_id for p in decisions.preemptions] == ["long"]
    assert started(decisions) == ["short"]
    # a job that just (re)started is not preempted again at once (no thrashing)
    scheduler.submit(oracle("tiny", 1, 5001.0, 10.0), consolidated_gang("tiny", 1, 2))
    assert scheduler.schedule(5001.0, consider_preemption=True).preemptions[0].job_id == "mid"


def test_tiresias_preempts_only_lower_levels():
    scheduler = Scheduler(POLICIES["tiresias"], ClusterState.empty(uniform_cluster(1, 1)), "best-fit")
    scheduler.submit(view("old", 1), consolidated_gang("old", 1, 1))
    scheduler.schedule(0.0)
    scheduler.submit(view("new", 1, 100.0), consolidated_gang("new", 1, 1))
    # at t=1000 "old" attained 1000 GPU-s: still level 0, same as "new": no preemption
    assert scheduler.schedule(1000.0, consider_preemption=True).preemptions == []
    # at t=4000 it is past the first threshold (3600 GPU-s)
    decisions = scheduler.schedule(4000.0, consider_preemption=True)
    assert [p.job_id for p in decisions.preemptions] == ["old"] and started(decisions) == ["new"]


def test_fair_share_serves_the_queue_below_its_guarantee():
    shares = {"a": 2.0, "b": 2.0}
    scheduler = Scheduler(
        POLICIES["fifo-backfill"], ClusterState.empty(uniform_cluster(1, 4)), "best-fit", queue_shares=shares
    )
    for index in range(4):
        scheduler.submit(view(f"a{index}", 1, float(index), queue="a"), consolidated_gang(f"a{index}", 1, 4))
    scheduler.submit(view("b0", 1, 10.0, queue="b"), consolidated_gang("b0", 1, 4))
    scheduler.submit(view("b1", 1, 11.0, queue="b"), consolidated_gang("b1", 1, 4))
    decisions = scheduler.schedule(20.0)
    assert sorted(started(decisions)) == ["a0", "a1", "b0", "b1"]
    # without fair share, strict submit order wins
    plain = Scheduler(POLICIES["fifo-backfill"], ClusterState.empty(uniform_cluster(1, 4)), "best-fit")
    for index in range(4):
        plain.submit(view(f"a{index}", 1, float(index), queue="a"), consolidated_gang(f"a{index}", 1, 4))
    plain.submit(view("b0", 1, 10.0, queue="b"), consolidated_gang("b0", 1, 4))
    assert sorted(started(plain.schedule(20.0))) == ["a0", "a1", "a2", "a3"]


def forecast_view(job_id: str, gpus: int, submit: float, p50: float, p90: float, executed: float = 0.0) -> JobView:
    features = JobFeatures(job_id, "q", "", float(gpus), "", submit)
    forecast = RuntimeForecast(p50, p90, "test", 0)
    return JobView(features, gpus, "q", submit, executed_s=executed, forecast=forecast)


def test_kumiki_lets_a_blocked_job_in_when_a_running_job_ages_past_it():
    """Ranks of running jobs move; a recheck of the aged job (its node only) lets the waiting job preempt."""
    scheduler = Scheduler(POLICIES["kumiki"], ClusterState.empty(uniform_cluster(1, 2)), "best-fit")
    scheduler.submit(forecast_view("old", 1, 0.0, 1000.0, 2000.0), consolidated_gang("old", 1, 2))
    scheduler.schedule(0.0)
    scheduler.submit(forecast_view("new", 2, 700.0, 400.0, 800.0), consolidated_gang("new", 2, 2), now=700.0)
    # at 700 s "old" is expected to end soon (its forecast median is 1000 s): no preemption
    assert scheduler.schedule(700.0, consider_preemption=True).preemptions == []
    # long past its forecast it ranks far below "new"; a pass without a reason to look changes nothing
    assert scheduler.schedule(30_000.0).preemptions == []
    decisions = scheduler.schedule(30_000.0, recheck=["old"])
    assert [p.job_id for p in decisions.preemptions] == ["old"] and started(decisions) == ["new"]


def test_kumiki_protect_protects_full_node_jobs_after_their_first_intervals():
    scheduler = Scheduler(POLICIES["kumiki-protect"], ClusterState.empty(uniform_cluster(2, 8)), "best-fit")
    full = consolidated_gang("full", 8, 8)
    single = consolidated_gang("single", 1, 8)
    pair = consolidated_gang("pair", 16, 8)
    assert scheduler.checkpoint_until(full, forecast_view("full", 8, 0.0, 10.0, 20.0)) == KUMIKI_PROTECT_AFTER_S
    assert scheduler.checkpoint_until(single, forecast_view("single", 1, 0.0, 10.0, 20.0)) == math.inf
    assert scheduler.checkpoint_until(pair, forecast_view("pair", 16, 0.0, 10.0, 20.0)) == 0.0
    # `kumiki` itself keeps every single-node job preemptible, full-node ones included (as Tiresias)
    default = Scheduler(POLICIES["kumiki"], ClusterState.empty(uniform_cluster(2, 8)), "best-fit")
    assert default.checkpoint_until(full, forecast_view("full", 8, 0.0, 10.0, 20.0)) == math.inf
    fifo = Scheduler(POLICIES["fifo"], ClusterState.empty(uniform_cluster(2, 8)), "best-fit")
    assert fifo.checkpoint_until(single, forecast_view("single", 1, 0.0, 10.0, 20.0)) == 0.0


def test_kumiki_protect_full_node_job_yields_early_but_not_once_protected():
    def blocked_at(now: float) -> Scheduler:
        scheduler = Scheduler(POLICIES["kumiki-protect"], ClusterState.empty(uniform_cluster(1, 8)), "best-fit")
        scheduler.submit(forecast_view("big", 8, 0.0, 100.0, 200.0), consolidated_gang("big", 8, 8))
        scheduler.schedule(0.0)
        scheduler.submit(forecast_view("small", 1, now, 100.0, 200.0), consolidated_gang("small", 1, 8), now=now)
        return scheduler

    early = blocked_at(KUMIKI_PROTECT_AFTER_S - 100.0)
    decisions = early.schedule(KUMIKI_PROTECT_AFTER_S - 100.0, consider_preemption=True)
    assert [p.job_id for p in decisions.preemptions] == ["big"]
    late = blocked_at(KUMIKI_PROTECT_AFTER_S + 100.0)
    assert late.schedule(KUMIKI_PROTECT_AFTER_S + 100.0, consider_preemption=True).preemptions == []


def test_kumiki_starving_job_evicts_even_a_higher_ranked_one():
    scheduler = Scheduler(POLICIES["kumiki"], ClusterState.empty(uniform_cluster(1, 4)), "best-fit")
    scheduler.submit(forecast_view("short", 3, 0.0, 100.0, 200.0), consolidated_gang("short", 3, 4))
    scheduler.schedule(0.0)
    scheduler.submit(forecast_view("long", 2, 10.0, 1e6, 2e6), consolidated_gang("long", 2, 4), now=10.0)
    # "long" ranks far below the running job: no preemption for it on its own merit
    assert scheduler.schedule(1000.0, consider_preemption=True).preemptions == []
    starving_at = 10.0 + POLICIES["kumiki"].starvation_s
    assert scheduler.schedule(starving_at - 1.0).preemptions == []
    decisions = scheduler.schedule(starving_at)
    assert [p.job_id for p in decisions.preemptions] == ["short"] and started(decisions) == ["long"]


def test_kumiki_starving_job_takes_its_room_from_the_lowest_ranked_job_not_the_cheapest():
    """Two 1-GPU jobs run on a 2-GPU node: "long" (forecast 1e7 s, 1,000 s of unsaved work when the waiter starves)
    and "short" (forecast 100 s, started 700 s before: less to lose). The starving job evicts "long", the job the
    order would run last; with the guard's earlier rule (the cheapest to stop) it evicted "short"."""
    waiter_at = 1000.0
    starving_at = waiter_at + POLICIES["kumiki"].starvation_s

    def evicted(policy: QueuePolicy) -> list[str]:
        scheduler = Scheduler(policy, ClusterState.empty(uniform_cluster(1, 2)), "best-fit")
        scheduler.submit(forecast_view("long", 1, 0.0, 1e7, 2e7), consolidated_gang("long", 1, 2))
        scheduler.submit(forecast_view("blocker", 1, 0.0, 100.0, 200.0), consolidated_gang("blocker", 1, 2))
        assert sorted(started(scheduler.schedule(0.0))) == ["blocker", "long"]
        waiter = forecast_view("waiter", 1, waiter_at, 5e6, 1e7)
        scheduler.submit(waiter, consolidated_gang("waiter", 1, 2), now=waiter_at)
        # on its own merit the waiter is within the rank margin of "long": no preemption
        assert scheduler.schedule(2000.0, consider_preemption=True).preemptions == []
        scheduler.finished("blocker")
        short_at = starving_at - 700.0
        scheduler.submit(
            forecast_view("short", 1, short_at, 100.0, 200.0), consolidated_gang("short", 1, 2), now=short_at
        )
        assert started(scheduler.schedule(short_at)) == ["short"]  # it outranks the waiter
        assert scheduler.schedule(starving_at - 1.0).preemptions == []
        decisions = scheduler.schedule(starving_at)
        assert started(decisions) == ["waiter"]
        assert all(p.reason == "starvation" for p in decisions.preemptions)
        return [p.job_id for p in decisions.preemptions]

    assert evicted(POLICIES["kumiki"]) == ["long"]
    assert evicted(dataclasses.replace(POLICIES["kumiki"], starvation_by_rank=False)) == ["short"]


def test_a_starving_gang_over_two_nodes_clears_the_two_that_lose_least_and_starts():
    """Three 8-GPU nodes each run a 5-GPU job forecast to run for weeks; a 16-GPU gang waits. At the starvation
    limit it evicts the jobs of the two nodes that lose least and starts. Before, a multi-node gang only reserved
    nodes and waited for them to drain on their own: weeks here, with the guard held from every other job."""
    policy = POLICIES["kumiki"]
    scheduler = Scheduler(policy, ClusterState.empty(uniform_cluster(3, 8)), "best-fit")
    for node, started_s in enumerate((0.0, 1000.0, 2000.0)):
        job_id = f"long-{node}"
        scheduler.submit(forecast_view(job_id, 5, started_s, 2e6, 4e6), consolidated_gang(job_id, 5, 8), now=started_s)
        assert started(scheduler.schedule(started_s)) == [job_id]
    assert [scheduler.running[f"long-{node}"].nodes for node in range(3)] == [(0,), (1,), (2,)]
    scheduler.submit(forecast_view("gang", 16, 3000.0, 1e4, 2e4), consolidated_gang("gang", 16, 8), now=3000.0)
    assert scheduler.schedule(3000.0, consider_preemption=True).preemptions == []  # no rank cascade
    starving_at = 3000.0 + policy.starvation_s
    assert scheduler.next_deadline(3001.0) == starving_at
    assert scheduler.schedule(starving_at - 1.0).preemptions == []
    lost = {job: scheduler.lost_work(job, starving_at)[1] for job in scheduler.running}
    nodes = {job: scheduler.running[job].nodes[0] for job in scheduler.running}
    assert len(set(lost.values())) == 3  # one answer, not a tie
    decisions = scheduler.schedule(starving_at)
    assert started(decisions) == ["gang"]
    assert all(p.reason == "starvation" and p.for_job == "gang" for p in decisions.preemptions)
    # the two whose unsaved work (since their last checkpoint) is least, each on its own node, which the gang takes
    unsaved = sorted((unsaved_gpu_s, job) for job, unsaved_gpu_s in lost.items())
    assert sorted(p.job_id for p in decisions.preemptions) == sorted(job for _, job in unsaved[:2])
    assert set(scheduler.running["gang"].nodes) == {nodes[job] for _, job in unsaved[:2]}
    assert scheduler.reservation is None


def test_reconsider_reranks_waiting_jobs_and_keeps_their_wait():
    """A forecast switched off (the forecast gate) re-ranks the queue at once; starvation still counts from
    when each job first queued."""
    policy = dataclasses.replace(POLICIES["kumiki"], starvation_s=1000.0, starvation_preempts=False)
    scheduler = Scheduler(policy, ClusterState.empty(uniform_cluster(1, 1)), "best-fit")
    scheduler.submit(view("blocker", 1, 0.0, p90=10_000.0), consolidated_gang("blocker", 1, 1))
    assert started(scheduler.schedule(0.0)) == ["blocker"]
    scheduler.submit(view("first", 1, 1.0, p90=8000.0), consolidated_gang("first", 1, 1), now=1.0)
    scheduler.submit(view("second", 1, 2.0, p90=100.0), consolidated_gang("second", 1, 1), now=2.0)
    assert [job_id for _, job_id in scheduler.lists[("", (1,))]] == ["second", "first"]
    scheduler.reconsider([view("first", 1, 1.0), view("second", 1, 2.0), view("blocker", 1, 0.0)])
    # no forecasts: equal ranks, submit order
    assert [job_id for _, job_id in scheduler.lists[("", (1,))]] == ["first", "second"]
    assert scheduler.waiting["second"].view.forecast is None and scheduler.running["blocker"].view.forecast is None
    assert scheduler._starving(1001.0) == "first"
    assert scheduler.withdraw("second") and scheduler.waiting.keys() == {"first"}


def test_a_job_queued_again_starves_from_its_last_queueing():
    """ "quick" starts ahead of "head" and is preempted; queued again at 500 s, it starves at 1,500 s, not at 1,001 s
    (its first queueing, an entry left behind "head" in the queue-time heap)."""
    policy = dataclasses.replace(POLICIES["kumiki"], starvation_s=1000.0, starvation_preempts=False)
    scheduler = Scheduler(policy, ClusterState.empty(uniform_cluster(1, 1)), "best-fit")
    scheduler.submit(forecast_view("head", 1, 0.0, 1e5, 2e5), consolidated_gang("head", 1, 1), now=0.0)
    scheduler.submit(forecast_view("quick", 1, 1.0, 10.0, 20.0), consolidated_gang("quick", 1, 1), now=1.0)
    assert started(scheduler.schedule(1.0)) == ["quick"]
    assert scheduler.preempt("quick", "", "reclaim", 500.0).job_id == "quick"
    scheduler.submit(forecast_view("quick", 1, 1.0, 10.0, 20.0), consolidated_gang("quick", 1, 1), now=500.0)
    assert scheduler.withdraw("head")
    assert scheduler._starving(1001.0) is None
    assert scheduler.next_deadline(1001.0) == 1500.0
    assert scheduler._starving(1500.0) == "quick"


def test_next_deadline_is_the_earliest_starvation_or_reservation_deadline_still_ahead():
    policy = dataclasses.replace(RESERVING_KUMIKI, starvation_s=1000.0, starvation_preempts=False)
    scheduler = Scheduler(policy, ClusterState.empty(uniform_cluster(1, 4)), "best-fit")
    assert scheduler.next_deadline(0.0) is None  # nothing waits
    scheduler.submit(forecast_view("running", 4, 0.0, 100.0, 200.0), consolidated_gang("running", 4, 4), now=0.0)
    assert started(scheduler.schedule(0.0)) == ["running"]
    scheduler.submit(forecast_view("one", 1, 10.0, 50.0, 90.0), consolidated_gang("one", 1, 4), now=10.0)
    scheduler.submit(forecast_view("two", 2, 30.0, 50.0, 90.0), consolidated_gang("two", 2, 4), now=30.0)
    scheduler.submit(forecast_view("later", 1, 20.0, 50.0, 90.0), consolidated_gang("later", 1, 4), now=20.0)
    # each shape's longest waiting job counts; "later" waits behind "one"
    assert scheduler.next_deadline(100.0) == 1010.0
    assert scheduler.next_deadline(1010.0) == 1030.0  # "one" starves now; "two" is the next to
    assert scheduler.next_deadline(1030.0) is None
    # a reservation's deadline counts while its job waits and the policy lends its nodes
    scheduler.schedule(100.0)
    reservation = scheduler.reservation
    assert reservation is not None and policy.backfill_on_reserved
    assert scheduler.next_deadline(100.0) == min(1010.0, reservation.shadow_s)
    scheduler.reservation = dataclasses.replace(reservation, shadow_s=5000.0)
    assert scheduler.next_deadline(1030.0) == 5000.0
    assert scheduler.next_deadline(5000.0) is None


def test_kumiki_evicts_by_rank_only_past_the_margin_the_two_keys_errors_set():
    """The same two ranks: a newcomer evicts the running job when both keys forecast well, not when they do not."""

    def job(job_id: str, p50: float, error_sigma: float, submit: float) -> JobView:
        forecast = RuntimeForecast(p50, p50 * 3, "test", 0, log_sigma=0.3, error_sigma=error_sigma)
        return JobView(JobFeatures(job_id, "q", "", 1.0, "", submit), 1, "q", submit, forecast=forecast)

    def evictions(error_sigma: float) -> list[str]:
        scheduler = Scheduler(POLICIES["kumiki"], ClusterState.empty(uniform_cluster(1, 1)), "best-fit")
        scheduler.submit(job("long", 20_000.0, error_sigma, 0.0), consolidated_gang("long", 1, 1))
        assert started(scheduler.schedule(0.0)) == ["long"]
        scheduler.submit(job("short", 2_000.0, error_sigma, 1_000.0), consolidated_gang("short", 1, 1))
        decisions = scheduler.schedule(1_000.0, consider_preemption=True)
        assert started(decisions) == (["short"] if decisions.preemptions else [])
        return [p.job_id for p in decisions.preemptions]

    assert evictions(0.1) == ["long"]  # margin 4 x e^(1.28 x 0.14) = 4.8x: the ~9x rank gap clears it
    assert evictions(1.5) == []  # margin 4 x e^(1.28 x 2.1) = 60x: it does not


def test_a_job_running_far_past_a_badly_wrong_forecast_can_still_be_evicted_by_rank():
    """A long job forecast short on a key whose forecasts are off by ~5x (error 1.5) runs past its p90 by that
    error: from then on its rank is what it has run, and the forecast-free margin (4x) holds it, not 60x."""

    def job(job_id: str, p50: float, submit: float) -> JobView:
        forecast = RuntimeForecast(p50, p50 * 3, "test", 0, log_sigma=0.3, error_sigma=1.5)
        return JobView(JobFeatures(job_id, "q", "", 1.0, "", submit), 1, "q", submit, forecast=forecast)

    def evictions(policy: QueuePolicy, now: float) -> list[str]:
        scheduler = Scheduler(policy, ClusterState.empty(uniform_cluster(1, 1)), "best-fit")
        scheduler.submit(job("long", 100.0, 0.0), consolidated_gang("long", 1, 1))
        assert started(scheduler.schedule(0.0)) == ["long"]
        scheduler.submit(job("next", 2_000.0, now), consolidated_gang("next", 1, 1))
        return [p.job_id for p in scheduler.schedule(now, consider_preemption=True).preemptions]

    kumiki = POLICIES["kumiki"]
    assert evictions(kumiki, 200.0) == []  # within its forecast's error: ranked as forecast, the 60x holds
    assert evictions(kumiki, 20_000.0) == ["long"]  # ran 200x its p50: ranked by what it has run (~20,000 s)
    assert evictions(dataclasses.replace(kumiki, cap_margin_past_forecast=False), 20_000.0) == []


def test_a_gang_of_pods_smaller_than_a_node_starts_in_the_pass_on_one_node():
    """The pass's cheap pre-check once asked for a node per pod, so a queued gang of two 2-GPU pods never started
    on a free 8-GPU node (a preempted job's next generation waited for ever in placement)."""
    from kumiki.sched.jobs import GangRequest, PodRequest

    scheduler = Scheduler(POLICIES["kumiki"], ClusterState.empty(uniform_cluster(1, 8)), "best-fit")
    scheduler.submit(view("pair", 4), GangRequest("pair", (PodRequest(gpus=2), PodRequest(gpus=2))))
    scheduler.submit(view("wide", 12), GangRequest("wide", (PodRequest(gpus=8), PodRequest(gpus=4))))
    assert started(scheduler.schedule(0.0)) == ["pair"]
    assert scheduler.running["pair"].nodes == (0,)
    assert "wide" in scheduler.waiting  # 12 GPUs cannot fit 8, however they are split


def test_a_gang_whose_pods_fit_one_node_preempts_and_reserves_as_one_job_of_their_total():
    """Two 2-GPU pods are a 4-GPU job to make room for: the gang may evict a job the order ranks far below it
    from one node, and a reservation for it holds one node (it once asked for a node per pod: on a one-node
    cluster it could neither preempt nor reserve, and waited behind every newcomer)."""
    from kumiki.sched.jobs import GangRequest, PodRequest

    pair = GangRequest("pair", (PodRequest(gpus=2), PodRequest(gpus=2)))
    scheduler = Scheduler(POLICIES["kumiki"], ClusterState.empty(uniform_cluster(1, 8)), "best-fit")
    scheduler.submit(forecast_view("old", 6, 0.0, 1000.0, 2000.0), consolidated_gang("old", 6, 8))
    scheduler.schedule(0.0)
    scheduler.submit(forecast_view("pair", 4, 30_000.0, 400.0, 800.0), pair, now=30_000.0)
    decisions = scheduler.schedule(30_000.0, consider_preemption=True)  # "old" long past its forecast
    assert [p.job_id for p in decisions.preemptions] == ["old"] and started(decisions) == ["pair"]
    assert scheduler.running["pair"].nodes == (0,)

    reserving = Scheduler(RESERVING_KUMIKI, ClusterState.empty(uniform_cluster(1, 8)), "best-fit")
    reserving.submit(view("busy", 6, 0.0, p90=1000.0), consolidated_gang("busy", 6, 8))
    reserving.schedule(0.0)
    reserving.submit(view("pair", 4, 1.0, p90=100.0), pair)
    assert started(reserving.schedule(1.0)) == []
    assert reserving.reservation is not None and reserving.reservation.job_id == "pair"
    assert reserving.reservation.nodes == frozenset({0})
    assert reserving.span((2, 2)) == (4, 1) and reserving.span((8, 8)) == (8, 2) and reserving.span((8, 4)) == (8, 2)
