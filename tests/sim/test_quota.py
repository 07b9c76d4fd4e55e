"""Quota admission in the simulator (`kumiki.sim.quota`): the quota service's core decides, with the live stack's
rules: a limit is never exceeded (a preempted job's next generation is admitted afresh), idle GPUs are lent, a
guarantee's owner gets them back by reclaim, and a tree that never binds changes nothing."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.quota.core import ANY_MODEL, LifecycleState, Queue, QuotaConfig, build_config
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, SimResult, Simulator
from kumiki.sim.quota import QuotaTreeError, SimQuota


def tree(queues: dict[str, tuple[float, float | None]], capacity: float) -> QuotaConfig:
    """queue -> (guarantee, limit or None)."""
    leaves = [
        Queue(name, None, {ANY_MODEL: guarantee}, limit_gpus=limit) for name, (guarantee, limit) in queues.items()
    ]
    return build_config(leaves, {ANY_MODEL: capacity})


def simulate(jobs: list[SimJobSpec], policy: str, quota: QuotaConfig | None, nodes: int = 2) -> Simulator:
    simulator = Simulator(uniform_cluster(nodes, 4), jobs, SimConfig(POLICIES[policy], audit=True, quota=quota))
    simulator.run()
    return simulator


def peak_gpus_by_queue(simulator: Simulator) -> dict[str, float]:
    """The most GPUs each queue held at once, from the ledger's metered intervals."""
    assert simulator.quota is not None
    changes: dict[str, list[tuple[int, float]]] = {}
    for entry in simulator.quota.ledger.closed.values():
        changes.setdefault(entry.queue, []).extend(
            [(entry.start_us, float(entry.gpus)), (entry.end_us, -float(entry.gpus))]
        )
    peaks = {}
    for queue, steps in changes.items():
        held = peak = 0.0
        for _, delta in sorted(steps, key=lambda step: (step[0], step[1])):  # an end before a start at one instant
            held += delta
            peak = max(peak, held)
        peaks[queue] = peak
    return peaks


def random_jobs(seed: int, count: int, largest: dict[str, int]) -> list[SimJobSpec]:
    """`largest`: each queue's biggest job (a job above its queue's limit could never run)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        queue = rng.choice(sorted(largest))
        gpus = min(rng.choice([1, 1, 2, 4, 8]), largest[queue])
        jobs.append(SimJobSpec(f"j{i}", rng.uniform(0, 20_000), gpus, rng.uniform(100, 20_000), queue))
    return jobs


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "srtf-oracle"])
def test_a_static_limit_holds_across_preemptions_and_every_job_finishes(policy: str) -> None:
    jobs = random_jobs(7, 60, {"a": 4, "b": 8})
    quota = tree({"a": (4, 4), "b": (4, 8)}, 8)
    simulator = simulate(jobs, policy, quota)
    assert len(simulator.results) == len(jobs)
    peaks = peak_gpus_by_queue(simulator)
    assert peaks["a"] <= 4 and peaks["b"] <= 8
    assert peaks["a"] == 4  # the limit is reached, so it was what held jobs back
    assert not simulator.quota.holdings and not simulator.quota.held  # every admission ended with its job
    if POLICIES[policy].preemptive:
        assert sum(job.preemptions for job in simulator.results) > 0  # next generations were admitted afresh


def test_a_borrower_is_reclaimed_when_the_owner_arrives_and_the_owner_starts_on_its_gpus() -> None:
    jobs = [SimJobSpec("borrower", 0.0, 8, 50_000.0, "batch"), SimJobSpec("owner", 1_000.0, 8, 500.0, "team")]
    quota = tree({"team": (8, None), "batch": (0, None)}, 8)
    simulator = simulate(jobs, "fifo", quota, nodes=2)
    by_id = {job.job_id: job for job in simulator.results}
    assert by_id["owner"].first_start_s == 1_000.0  # at once, on the borrower's GPUs (FIFO alone never preempts)
    assert by_id["borrower"].preemptions == 1
    assert by_id["borrower"].finish_s > by_id["owner"].finish_s
    assert simulator.quota is not None and simulator.quota.reclaims == 1
    result = simulator.run()
    assert isinstance(result, SimResult) and result.quota is not None and result.quota["reclaims"] == 1


def test_without_reclaim_the_owner_waits_for_the_borrower() -> None:
    """Control for the test above: with no tree, FIFO keeps the borrower running and the owner waits."""
    jobs = [SimJobSpec("borrower", 0.0, 8, 50_000.0, "batch"), SimJobSpec("owner", 1_000.0, 8, 500.0, "team")]
    by_id = {job.job_id: job for job in simulate(jobs, "fifo", None).results}
    assert by_id["owner"].first_start_s == 50_000.0 and by_id["borrower"].preemptions == 0


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), policy=st.sampled_from(["fifo", "tiresias", "srtf-oracle", "fifo-backfill"]))
def test_a_tree_that_never_binds_changes_nothing(seed: int, policy: str) -> None:
    """One queue guaranteed all the work there is: every attempt is admitted at once, so the run is the open
    run. (A guarantee of just the cluster would bind: admitted work waiting in the queue holds quota too, and
    the rest is held in arrival order, as live.)"""
    jobs = random_jobs(seed, 30, {"only": 8})
    open_run = {job.job_id: (job.first_start_s, job.finish_s) for job in simulate(jobs, policy, None).results}
    demand = float(sum(job.gpus for job in jobs))
    quota = tree({"only": (demand, None)}, demand)  # the cluster's 8 GPUs lower it, as live capacity does
    with_tree = simulate(jobs, policy, quota)
    assert {job.job_id: (job.first_start_s, job.finish_s) for job in with_tree.results} == open_run
    assert with_tree.quota is not None and with_tree.quota.denied == {} and with_tree.quota.reclaims == 0


def test_held_jobs_count_as_waiting_and_denials_are_counted_by_code() -> None:
    jobs = [SimJobSpec("first", 0.0, 4, 1_000.0, "a"), SimJobSpec("second", 0.0, 4, 1_000.0, "a")]
    simulator = simulate(jobs, "fifo", tree({"a": (4, 4)}, 8))
    by_id = {job.job_id: job for job in simulator.results}
    assert sorted(job.first_start_s for job in by_id.values()) == [0.0, 1_000.0]  # 4 GPUs free, yet it waited
    assert simulator.quota is not None and dict(simulator.quota.denied) == {"limit_exceeded": 1}
    assert any(sample.queue_length == 1 for sample in simulator.samples)


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (SimJobSpec("x", 0.0, 1, 10.0, "nowhere"), "job x: queue 'nowhere' is not in the queue tree"),
        (SimJobSpec("y", 0.0, 8, 10.0, "a"), "job y: 8 GPUs, above the limit of queue a"),
    ],
)
def test_a_job_the_tree_could_never_admit_is_refused_before_the_run(job: SimJobSpec, message: str) -> None:
    with pytest.raises(QuotaTreeError, match=message):
        Simulator(uniform_cluster(2, 4), [job], SimConfig(POLICIES["fifo"], quota=tree({"a": (4, 4)}, 8)))


class AskingEveryHeldJob(SimQuota):
    """Placement's cycle taken literally: every held job asked at every pass (those past the starvation limit
    first, oldest first, then by rank), and asked all over again after a release the round itself caused."""

    def ask_held(self, enter: Callable[[str], bool], starving_before: float = -math.inf) -> None:
        def order(job_id: str) -> tuple[object, ...]:
            *_, since = self._held_class[job_id]
            return ((0.0, since) if since <= starving_before else self.held[job_id], job_id)

        self._released = True
        while self._released:
            self._released = False
            for job_id in sorted(self.held, key=order):
                if job_id in self.held:
                    enter(job_id)
                    if self._released:
                        break


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(["fifo", "tiresias", "srtf-oracle", "kumiki-oracle"]),
    limit_a=st.sampled_from([None, 4.0, 6.0]),
    guarantee_b=st.sampled_from([0.0, 2.0, 4.0]),
)
def test_rounds_that_skip_what_cannot_be_admitted_answer_as_asking_every_held_job(
    seed: int, policy: str, limit_a: float | None, guarantee_b: float
) -> None:
    jobs = random_jobs(seed, 40, {"a": 4, "b": 8, "c": 2})
    quota = tree({"a": (4.0, limit_a), "b": (guarantee_b, None), "c": (0.0, None)}, 8)
    runs = []
    for book in (SimQuota, AskingEveryHeldJob):
        simulator = Simulator(uniform_cluster(2, 4), jobs, SimConfig(POLICIES[policy], audit=True, quota=quota))
        assert simulator.quota is not None
        simulator.quota = book(simulator.quota.config)
        result = simulator.run()
        runs.append(({job.job_id: (job.first_start_s, job.finish_s) for job in result.jobs}, result.quota))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == len(jobs)


def test_a_round_asks_the_starving_first_oldest_first_then_by_rank_and_skips_what_a_denial_answers() -> None:
    quota = SimQuota(tree({"a": (0.0, 0.0), "b": (1.0, 1.0)}, 8))  # a admits nothing; b one GPU
    jobs = {
        "short-new": ("a", 1, (1.0, 0.0, 10.0), 900.0),
        "long-old": ("a", 1, (1.0, 0.0, 99.0), 5.0),
        "older": ("b", 2, (1.0, 0.0, 50.0), 1.0),
        "big": ("a", 4, (1.0, 0.0, 1.0), 800.0),
        "mid": ("b", 1, (1.0, 0.0, 20.0), 700.0),
    }
    assert quota.ask("filler", 1, "b", 1, (1.0, 0.0, 0.0), 0.0) is not None  # b's one GPU
    for job_id, (queue, gpus, rank, arrival) in jobs.items():
        assert quota.ask(job_id, 1, queue, gpus, rank, arrival) is None
    quota.ended("filler", 1, 0.0, LifecycleState.COMPLETED)  # a release: the next round asks
    asked: list[str] = []

    def enter(job_id: str) -> bool:
        asked.append(job_id)
        return quota.ask(job_id, 2, *jobs[job_id]) is not None

    quota.ask_held(enter, starving_before=10.0)
    # starving (arrived by 10 s): older, then long-old. long-old's denial of 1 GPU answers for every job of a:
    # big and short-new are not asked. Then by rank: mid (b's 2-GPU denial does not answer for 1 GPU).
    assert asked == ["older", "long-old", "mid"]
    assert set(quota.held) == {"short-new", "long-old", "older", "big"}
    asked.clear()
    quota.ask_held(enter, starving_before=10.0)
    assert asked == []  # no release since: nothing to ask


def test_a_job_quota_held_keeps_its_wait_in_the_queue_and_starves_on_time() -> None:
    """z is held by its queue's limit for 20 h, then admitted where no node has its 4 GPUs free together. Its
    wait goes on in the queue, as placement's does (`PendingJob.waiting_since_s`): it starves at exactly the
    limit after its arrival and evicts a borrower for room. Counted from its admission it waited 33 h."""
    from kumiki.sched.policies import STARVATION_S

    hour = 3_600.0
    jobs = [
        SimJobSpec("w", 0.0, 2, 20 * hour, "a"),  # team a's limit is 4: z (4 GPUs) is held while w runs
        SimJobSpec("x", 0.0, 2, 100 * hour, "b"),
        SimJobSpec("y", 0.0, 2, 100 * hour, "b"),
        SimJobSpec("z", 1.0, 4, hour, "a"),
    ]
    simulator = simulate(jobs, "kumiki-noforecast", tree({"a": (4, 4), "b": (0, None)}, 8))
    by_id = {job.job_id: job for job in simulator.results}
    assert simulator.quota is not None and dict(simulator.quota.denied) == {"limit_exceeded": 1}
    assert by_id["z"].first_start_s == 1.0 + STARVATION_S
    assert sorted(job.preemptions for job in by_id.values()) == [0, 0, 0, 1]
