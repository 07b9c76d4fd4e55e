"""The simulator's zombies and idle reclaim (`SimJobSpec.idle`, `SimConfig.idle`): placement's rule, the same
`IdlePolicy.reclaims`, applied to jobs that hold GPUs and compute nothing."""

from __future__ import annotations

import pytest

from kumiki.quota.core import ANY_MODEL, Queue, build_config
from kumiki.sched.cluster import uniform_cluster
from kumiki.sched.idle import parse_idle_reclaim
from kumiki.sched.policies import POLICIES
from kumiki.sim.engine import SimConfig, SimJobSpec, SimResult, Simulator
from kumiki.sim.report import idle_table, summarize
from kumiki.sim.scenarios import IdleReclaim, OnDemandCheckpoint, is_idle_job
from kumiki.sim.trace import TraceJob
from kumiki.sim.workload import WorkloadError, sim_jobs

RESTORE_S = 60.0  # the default checkpoint model's restore


def run(jobs: list[SimJobSpec], policy: str, rules: str = "", gpus: int = 1, **config: object) -> SimResult:
    idle = IdleReclaim(600.0, parse_idle_reclaim(rules))
    sim_config = SimConfig(POLICIES[policy], audit=True, idle=idle, **config)  # type: ignore[arg-type]
    return Simulator(uniform_cluster(1, gpus), jobs, sim_config).run()


def by_id(result: SimResult) -> dict[str, tuple[float, float]]:
    return {job.job_id: (job.first_start_s, job.finish_s) for job in result.jobs}


def zombie(duration_s: float = 2_000.0, queue: str = "q") -> SimJobSpec:
    return SimJobSpec("zombie", 0.0, 1, duration_s, queue, idle=True)


def test_without_a_rule_a_zombie_keeps_its_gpus_and_is_only_found() -> None:
    result = run([zombie(), SimJobSpec("waiter", 100.0, 1, 100.0, "q")], "tiresias")
    assert by_id(result) == {"zombie": (0.0, 2_000.0), "waiter": (2_000.0, 2_100.0)}
    assert (result.idle_found, result.idle_reclaimed, result.idle_gpu_s) == (1, 0, 2_000.0)


def test_a_found_zombie_gives_its_gpus_to_a_waiting_job_and_keeps_the_time_it_held() -> None:
    result = run([zombie(), SimJobSpec("waiter", 100.0, 1, 100.0, "q")], "kumiki-noforecast", "*=waiting:0")
    # found 600 s into its run, evicted for the waiter (ranked first: no service yet); it loses nothing and
    # comes back after a restore for the 1,400 s it has left
    assert by_id(result) == {"waiter": (600.0, 700.0), "zombie": (0.0, 700.0 + RESTORE_S + 1_400.0)}
    assert (result.idle_found, result.idle_reclaimed) == (2, 1)  # found again on its second run; nobody waits
    (evicted,) = [job for job in result.jobs if job.idle]
    assert evicted.preemptions == 1 and evicted.lost_gpu_s == RESTORE_S


def test_on_demand_the_job_a_zombie_is_reclaimed_for_waits_for_its_acknowledgement() -> None:
    """Idle reclaim evicts before the pass that starts the waiter; the waiter still waits while the zombie answers
    the checkpoint request (60 s), as the live protocol makes it, and the zombie holds its GPU idle meanwhile."""
    on_demand = OnDemandCheckpoint(deadline_s=300.0, ack_s=60.0)
    jobs = [zombie(), SimJobSpec("waiter", 100.0, 1, 100.0, "q")]
    result = run(jobs, "kumiki-noforecast", "*=waiting:0", on_demand=on_demand)
    assert by_id(result) == {"waiter": (600.0, 760.0), "zombie": (0.0, 760.0 + RESTORE_S + 1_400.0)}
    assert result.idle_gpu_s == 600.0 + 60.0 + 1_400.0 + RESTORE_S  # its runs, its restore, and the 60 s it held
    periodic = run(jobs, "kumiki-noforecast", "*=waiting:0")
    assert by_id(periodic)["waiter"] == (600.0, 700.0)  # periodic checkpoints: nothing to wait for


def test_under_waiting_a_zombie_is_reclaimed_only_once_someone_waits() -> None:
    result = run([zombie(), SimJobSpec("late", 1_000.0, 1, 100.0, "q")], "kumiki-noforecast", "*=waiting:0")
    assert by_id(result)["late"] == (1_000.0, 1_100.0)  # found at 600 s, reclaimed at the arrival
    assert result.idle_reclaimed == 1


def test_after_reclaims_with_nobody_waiting_and_each_queue_keeps_its_own_rule() -> None:
    result = run([zombie(queue="a")], "tiresias", "a=after:900, *=never")
    # evicted 900 s into each run: progress 900, then 840 (the restore first), then the 260 s left
    assert by_id(result)["zombie"] == (0.0, 1_800.0 + RESTORE_S + 260.0)
    assert result.idle_reclaimed == 2
    other = run([zombie(queue="b")], "tiresias", "a=after:900, *=never")
    assert by_id(other)["zombie"] == (0.0, 2_000.0) and other.idle_reclaimed == 0


@pytest.mark.parametrize("policy", ["fifo", "fifo-backfill", "tiresias", "kumiki-noforecast"])
def test_a_reclaimed_zombie_waits_behind_the_jobs_that_compute_whatever_the_order(policy: str) -> None:
    # by its key alone it came back first under FIFO (its arrival) and Tiresias (its 600 GPU-s still in the first
    # level, and older): it took back the GPU it gave up, every 600 s while the waiter waited
    jobs = [zombie(), SimJobSpec("waiter", 100.0, 1, 100.0, "q"), SimJobSpec("later", 650.0, 1, 100.0, "q")]
    result = run(jobs, policy, "*=waiting:0")
    assert by_id(result) == {
        "waiter": (600.0, 700.0),
        "later": (700.0, 800.0),  # arrived after the eviction, and still ahead of the zombie
        "zombie": (0.0, 800.0 + RESTORE_S + 1_400.0),
    }
    assert result.idle_reclaimed == 1


@pytest.mark.parametrize("policy", ["fifo", "fifo-backfill", "tiresias", "kumiki-noforecast"])
def test_a_zombie_is_not_reclaimed_for_a_zombie_idle_reclaim_evicted(policy: str) -> None:
    # one GPU: the first zombie gives it to the waiter at 600 s, the second takes it at 1,600 s and is found at
    # 2,200 s while the first waits demoted. Evicted for the first, the second waited to evict it in turn, 4 to 6
    # evictions before either finished, and the GPU computed nothing throughout
    jobs = [
        zombie(),
        SimJobSpec("waiter", 100.0, 1, 1_000.0, "q"),
        SimJobSpec("zombie-b", 200.0, 1, 2_000.0, "q", idle=True),
    ]
    result = run(jobs, policy, "*=waiting:0")
    assert by_id(result) == {
        "waiter": (600.0, 1_600.0),
        "zombie-b": (1_600.0, 3_600.0),
        "zombie": (0.0, 3_600.0 + RESTORE_S + 1_400.0),
    }
    assert result.idle_reclaimed == 1


def test_a_job_quota_holds_back_counts_as_waiting() -> None:
    # two GPUs; queue b's limit (1 GPU) holds its second job back while the first runs: nothing is queued, and
    # the zombie in queue a is reclaimed for the held job all the same (placement counts held jobs as waiting)
    leaves = [Queue("a", None, {ANY_MODEL: 1.0}), Queue("b", None, {ANY_MODEL: 1.0}, limit_gpus=1.0)]
    tree = build_config(leaves, {ANY_MODEL: 2.0})
    jobs = [
        zombie(queue="a"),
        SimJobSpec("b1", 0.0, 1, 5_000.0, "b"),
        SimJobSpec("b2", 100.0, 1, 100.0, "b"),
    ]
    result = run(jobs, "tiresias", "*=waiting:0", gpus=2, quota=tree)
    assert result.idle_reclaimed >= 1
    assert result.quota is not None


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "kumiki-noforecast"])
def test_zombies_do_not_change_a_run_where_nothing_reclaims_them(policy: str) -> None:
    jobs = [SimJobSpec(f"j{i}", 200.0 * i, 1 + i % 2, 900.0 + 37 * i, "q") for i in range(12)]
    plain = run(jobs, policy, gpus=2)
    marked = run(
        [SimJobSpec(j.job_id, j.submit_s, j.gpus, j.duration_s, j.queue, idle=i % 3 == 0) for i, j in enumerate(jobs)],
        policy,
        gpus=2,
    )
    assert by_id(marked) == by_id(plain)
    assert marked.idle_reclaimed == 0 and marked.idle_gpu_s > 0


def test_each_job_draws_its_own_zombie_so_a_window_keeps_the_wholes_draw() -> None:
    trace = [TraceJob(f"j{i}", 60.0 * i, 1.0, None, None, 600.0, "u", "q", "Pass", "") for i in range(2_000)]
    whole = {job.job_id: job.idle for job in sim_jobs(trace, max_gpus=8, seed=4, idle_share=0.1)}
    part = {job.job_id: job.idle for job in sim_jobs(trace[500:900], max_gpus=8, seed=4, idle_share=0.1)}
    assert all(whole[job_id] == idle for job_id, idle in part.items())
    assert 140 <= sum(whole.values()) <= 260
    assert whole != {job.job_id: job.idle for job in sim_jobs(trace, max_gpus=8, seed=5, idle_share=0.1)}
    assert not any(is_idle_job(f"j{i}", 0.0) for i in range(100))
    with pytest.raises(WorkloadError, match="idle share"):
        sim_jobs(trace, max_gpus=8, idle_share=1.0)
    with pytest.raises(ValueError, match="found_after_s"):
        IdleReclaim(0.0)


def test_the_report_sets_the_zombies_apart() -> None:
    result = run([zombie(), SimJobSpec("waiter", 100.0, 1, 100.0, "q")], "kumiki-noforecast", "*=waiting:0")
    summary = summarize(result, large_gpus=8)
    assert summary["idle_jobs"] == 1 and summary["idle_reclaimed"] == 1
    assert summary["avg_jct_computing_s"] == pytest.approx(600.0 - 100.0 + 100.0)
    assert summary["avg_jct_idle_s"] == pytest.approx(2_160.0)
    # the zombie held the GPU 600 + 1,460 s of the 2,160 s; the waiter computed for 100 s of it
    assert summary["idle_gpu_hours"] == pytest.approx(2_060.0 / 3600.0)
    assert summary["computing_utilization"] == pytest.approx(100.0 / 2_160.0)
    table = idle_table({"kumiki": summary, "plain": summarize(run([SimJobSpec("x", 0.0, 1, 10.0)], "fifo"))})
    assert "| kumiki | 1 | 0.6 | 2 | 1 | 0.046 | 600 | 2,160 |" in table and "plain" not in table
    assert "idle_jobs" not in summarize(run([SimJobSpec("x", 0.0, 1, 10.0)], "fifo"))
