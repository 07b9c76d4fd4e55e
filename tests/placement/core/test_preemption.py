"""Placement's book with a preemptive policy, pure: victims keep their GPUs until released as PREEMPTED, what
is placed on them waits nominated, the next generation is queued, and victim choice reads acknowledged
checkpoints."""

from __future__ import annotations

from kumiki.placement.core import PlacementBook, ServiceSoFar, parse_idle_reclaim
from kumiki.sched.forecasting import RuntimeForecast
from tests.placement.core.helpers import gang, node


def preemptive_book() -> PlacementBook:
    book = PlacementBook(policy="kumiki", min_run_s=0.0)
    for name in ("a", "b"):
        book.upsert_node(node(name), healthy=True)
    return book


def test_victim_keeps_running_until_released_then_the_next_generation_queues() -> None:
    book = preemptive_book()
    assert book.bind(gang("filler", 8), 0.0).job is not None
    train = book.bind(gang("train", 4, preemptible=True), 0.0).job
    assert train is not None
    book.checkpointed("train", 100.0)
    outcome = book.bind(gang("urgent", 8, tier=1), 130.0)
    assert not outcome.bound and outcome.reason is not None and outcome.reason.resource == "preemption"
    (victim,) = book.preemptions
    assert victim.job.command.job_id == "train" and victim.preemption.reason == "priority"
    assert victim.preemption.since_checkpoint_s == 30.0 and victim.preemption.lost_gpu_s == 120.0
    assert "train" in book.draining and "urgent" in book.nominated
    assert book.explain("urgent").status == "pending" and book.explain("train").status == "preempting"
    assert book.cycle(131.0) == []  # the victim has not left: nothing starts on its GPUs
    assert not book.audit()
    released = book.release_preempted("train", 1, 140.0)
    assert released is not None and released[1].generation == 2
    assert book.release_preempted("train", 1, 141.0) is None  # idempotent
    started = book.cycle(141.0)
    assert [job.command.job_id for job in started] == ["urgent"]
    assert started[0].node_names == train.node_names  # the victim's node
    assert book.pending["train"].command.generation == 2  # waits: nothing free, nothing it may preempt
    assert not book.audit()


def test_a_next_generation_quota_denies_is_held_even_where_it_fits() -> None:
    """The PREEMPTED release ends the attempt's admission: the next generation runs only once quota admits it."""
    book = preemptive_book()
    assert book.bind(gang("train", 4, preemptible=True), 0.0).job is not None
    assert book.release_preempted("train", 1, 50.0, denied="queue org/batch would hold 12 GPUs") is not None
    waiting = book.pending["train"]
    assert waiting.held and waiting.command.generation == 2 and waiting.reason.resource == "quota"
    assert "12 GPUs" in waiting.reason.constraint
    assert book.cycle(51.0) == []  # 16 GPUs free, yet it waits for quota
    assert [job.command.job_id for job in book.held_jobs(51.0)] == ["train"]
    book.admit("train", 52.0)
    assert [(job.command.job_id, job.command.generation) for job in book.cycle(52.0)] == [("train", 2)]
    assert not book.audit()


def idle_book(rule: str) -> PlacementBook:
    book = preemptive_book()
    book.idle_policies = parse_idle_reclaim(rule)
    assert book.bind(gang("filler", 8), 0.0).job is not None
    assert book.bind(gang("idle", 4, preemptible=True), 0.0).job is not None
    return book


def test_a_job_idle_past_its_queues_threshold_yields_to_a_waiting_job() -> None:
    book = idle_book("q=waiting:600")
    book.gpu_idle("idle", 1, 100.0, 400.0)
    book.gpu_idle("idle", 1, 400.0, 750.0)  # consecutive windows join: idle from 100 s to 750 s
    assert book.cycle(760.0) == [] and not book.preemptions  # nobody waits: it keeps its GPUs
    outcome = book.bind(gang("next", 8), 760.0)
    assert not outcome.bound and outcome.reason is not None and outcome.reason.resource == "preemption"
    (victim,) = book.preemptions
    assert victim.preemption.reason == "idle-reclaim" and victim.preemption.for_job == "next"
    assert victim.preemption.since_checkpoint_s == 760.0  # never checkpointed: everything since its bind
    assert book.release_preempted("idle", 1, 770.0) is not None
    assert [job.command.job_id for job in book.cycle(771.0)] == ["next"]


def test_idle_reclaim_respects_never_after_and_non_preemptible_jobs() -> None:
    never = idle_book("*=never")
    never.gpu_idle("idle", 1, 0.0, 5000.0)
    never.bind(gang("next", 8), 5000.0)
    assert not never.preemptions
    after = idle_book("q=after:600")
    after.gpu_idle("idle", 1, 0.0, 500.0)
    after.cycle(600.0)
    assert not after.preemptions  # 500 s idle is under the threshold
    after.gpu_idle("idle", 1, 500.0, 700.0)
    after.cycle(700.0)
    assert [victim.preemption.reason for victim in after.preemptions] == ["idle-reclaim"]  # nobody needs to wait
    stale = idle_book("q=after:10")
    stale.gpu_idle("idle", 2, 0.0, 500.0)  # another attempt's report
    stale.gpu_idle("filler", 1, 0.0, 500.0)  # not preemptible
    stale.cycle(600.0)
    assert not stale.preemptions


def test_a_job_quota_holds_back_counts_as_waiting_for_a_zombies_gpus() -> None:
    import dataclasses

    from kumiki.sched.placement import PendingReason

    book = idle_book("q=waiting:0")
    book.gpu_idle("idle", 1, 0.0, 700.0)
    book.cycle(700.0)
    assert not book.preemptions  # nobody waits
    other_queue = dataclasses.replace(gang("elsewhere", 4), queue="other")
    book.hold(other_queue, PendingReason("elsewhere", "quota", "over-quota", ""), 700.0)
    book.cycle(701.0)
    # freed, the zombie's GPUs are its queue's idle guarantee, which quota lends to the held job
    (victim,) = book.preemptions
    assert victim.job.command.job_id == "idle" and victim.preemption.reason == "idle-reclaim"
    assert victim.preemption.for_job == "elsewhere"


def test_no_zombie_is_reclaimed_for_a_job_idle_reclaim_evicted_that_has_not_computed_since() -> None:
    """Its GPUs would go from one idle job to another, and the zombie displaced would wait to do the same."""
    import dataclasses

    from kumiki.sched.placement import PendingReason

    book = idle_book("q=waiting:0")  # filler: node a; the zombie holds 4 of node b
    book.gpu_idle("idle", 1, 0.0, 700.0)
    reclaimed = ServiceSoFar(idle_reclaims=1, reclaimed_generation=1)
    book.served["was-idle"] = reclaimed
    assert not book.bind(gang("was-idle", 8, generation=2, preemptible=True), 700.0).bound
    assert book.pending["was-idle"].command.generation == 2 and book.scheduler.waiting["was-idle"].view.demoted
    book.served["held-was-idle"] = reclaimed
    other_queue = dataclasses.replace(gang("held-was-idle", 4, generation=2), queue="other")
    book.hold(other_queue, PendingReason("held-was-idle", "quota", "over-quota", ""), 700.0)
    book.cycle(701.0)
    assert not book.preemptions  # the zombie's GPUs would let either start, but each was found idle itself
    assert not book.bind(gang("fresh", 8), 702.0).bound
    (victim,) = book.preemptions
    assert (victim.job.command.job_id, victim.preemption.for_job) == ("idle", "fresh")


def reclaimed_for_a_held_teammate(teammate_gpus: int) -> PlacementBook:
    """The idle job reclaimed (and released at 702 s) for a teammate quota holds back."""
    from kumiki.sched.placement import PendingReason

    book = idle_book("q=waiting:0")
    book.gpu_idle("idle", 1, 0.0, 700.0)
    book.hold(gang("teammate", teammate_gpus), PendingReason("teammate", "quota", "over-quota", ""), 700.0)
    book.cycle(701.0)
    assert [victim.preemption.for_job for victim in book.preemptions] == ["teammate"]
    assert book.freed_for_held("teammate") and not book.freed_for_held("idle")  # quota is not asked for the victim
    assert book.release_preempted("idle", 1, 702.0, "teammate") is not None
    return book


def test_a_reclaimed_victim_sits_out_one_admission_round_behind_the_held_job_it_yielded_to() -> None:
    book = reclaimed_for_a_held_teammate(4)
    assert book.pending["idle"].held and book.pending["idle"].command.generation == 2
    assert [job.command.job_id for job in book.held_jobs(703.0)] == ["teammate"]  # the victim is older, yet waits
    book.admit("teammate", 703.0)
    assert [job.command.job_id for job in book.cycle(703.0)] == ["teammate"]  # on the freed GPUs
    assert [job.command.job_id for job in book.held_jobs(703.0)] == ["idle"]  # the next round asks for the victim


def test_a_victim_gives_way_while_quota_still_holds_the_job_its_gpus_were_freed_for() -> None:
    """Quota may answer from before the release for several rounds: the victim sits them out (and a Bind retry of
    it is not bound, `yields`), for at most YIELD_ROUNDS; then it is asked again, so it cannot starve."""
    from kumiki.placement.core import YIELD_ROUNDS

    book = reclaimed_for_a_held_teammate(8)  # a whole node
    for _ in range(YIELD_ROUNDS):  # quota refuses the teammate every round: the victim still waits
        assert book.yields("idle")
        assert [job.command.job_id for job in book.held_jobs(703.0)] == ["teammate"]
    assert not book.yields("idle")
    # asked again, behind the teammate: idle reclaim evicted it, so it waits behind the jobs that compute
    assert [job.command.job_id for job in book.held_jobs(703.0)] == ["teammate", "idle"]


def test_the_held_job_a_victim_yielded_to_gets_its_gpus_even_when_both_are_admitted_in_one_round() -> None:
    """Once the victim no longer gives way, quota may admit both in one round: the victim, older and ranked better
    by the order, still does not take back the GPUs freed for the other (`freed_for`). (An idle-reclaimed victim
    is ordered behind the jobs that compute anyway; its count is cleared here, as for a victim of a reclaim that
    does not demote, so that `freed_for` alone keeps the GPUs for the teammate.)"""
    from dataclasses import replace

    from kumiki.placement.core import YIELD_ROUNDS

    book = reclaimed_for_a_held_teammate(8)
    assert book.served["idle"].idle_reclaims == 1
    book.served["idle"] = replace(book.served["idle"], idle_reclaims=0)
    book.forecast("idle", RuntimeForecast(60.0, 120.0, "m", 1, error_sigma=0.1))  # the order prefers the victim
    book.forecast("teammate", RuntimeForecast(1e6, 2e6, "m", 1, error_sigma=0.1))
    for _ in range(YIELD_ROUNDS + 1):
        book.held_jobs(703.0)
    assert [job.command.job_id for job in book.held_jobs(703.0)] == ["idle", "teammate"]
    book.admit("idle", 704.0)
    book.admit("teammate", 704.0)
    assert [job.command.job_id for job in book.cycle(704.0)] == ["teammate"]  # on the GPUs freed for it
    assert book.pending["idle"].command.generation == 2 and not book.pending["idle"].held  # waits its turn
    assert not book.freed_for and not book.audit()


def test_a_held_job_admitted_after_one_of_two_reclaims_waits_nominated_for_the_other_victim() -> None:
    """Two zombies on one node reclaimed for a whole-node job quota holds back; the first leaves, quota admits the
    job, and it is placed on the node at once (`freed_for`) while the second zombie still holds half of it. It must
    wait nominated until that one leaves too, as a job placed by the pass does: started, it shared GPUs with a
    job still running (a live `kumiki up` replay caught this as a GPU bound to two jobs)."""
    from kumiki.sched.placement import PendingReason

    book = preemptive_book()
    book.idle_policies = parse_idle_reclaim("q=waiting:0")
    assert book.bind(gang("filler", 8), 0.0).job is not None
    for zombie in ("idle", "idle2"):
        assert book.bind(gang(zombie, 4, preemptible=True), 0.0).job is not None
        book.gpu_idle(zombie, 1, 0.0, 700.0)
    book.hold(gang("teammate", 8), PendingReason("teammate", "quota", "over-quota", ""), 700.0)
    book.cycle(701.0)
    assert sorted(victim.job.command.job_id for victim in book.preemptions) == ["idle", "idle2"]
    assert book.release_preempted("idle", 1, 702.0, "teammate") is not None
    book.admit("teammate", 703.0)
    assert "idle2" in book.draining and "teammate" in book.nominated
    assert book.cycle(703.0) == [] and not book.audit()  # nothing starts on GPUs a victim still holds
    assert book.release_preempted("idle2", 1, 704.0, "teammate") is not None
    assert [job.command.job_id for job in book.cycle(704.0)] == ["teammate"]
    assert not book.audit()


def test_a_job_moved_off_a_gangs_node_waits_nominated_on_the_gpus_another_victim_still_holds() -> None:
    """`kumiki-defrag` moves a small job off the node a whole-node gang needs; it restarts elsewhere at once, and
    the only room elsewhere is a zombie's, reclaimed for a job quota holds back (the scheduler counts those GPUs
    free from the moment the zombie is named). The moved job must wait nominated until the zombie leaves, then
    start there; started at once, it shared GPUs with a job still running (the path the held-job fix above
    also closed, here through a defragmentation)."""
    from kumiki.sched.placement import PendingReason

    book = PlacementBook(policy="kumiki-defrag", min_run_s=0.0)
    for name in ("a", "b"):
        book.upsert_node(node(name), healthy=True)
    book.idle_policies = parse_idle_reclaim("q=waiting:0")
    layout = {job: book.bind(gang(job, 4, preemptible=job in ("small", "zombie")), 0.0).job for job in
              ("small", "filler", "zombie", "mate")}  # fmt: skip
    assert {job: bound.node_names for job, bound in layout.items() if bound} == {
        "small": ("a",), "filler": ("a",), "zombie": ("b",), "mate": ("b",)
    }  # fmt: skip
    book.release("filler", 1)  # node a: the small job and 4 free GPUs; node b full
    book.checkpointed("small", 690.0)
    book.gpu_idle("zombie", 1, 0.0, 700.0)
    book.hold(gang("held", 4), PendingReason("held", "quota", "over-quota", ""), 700.0)
    book.cycle(701.0)
    assert [(victim.job.command.job_id, victim.preemption.reason) for victim in book.preemptions] == [
        ("zombie", "idle-reclaim")
    ]
    assert not book.bind(gang("gang", 8), 702.0).bound
    assert book.draining["small"].preemption.reason == "defragmentation"
    assert book.release_preempted("small", 1, 703.0, "gang") is not None
    moved = book.nominated.get("small")
    assert moved is not None and moved.node_names == ("b",), "placed on the zombie's GPUs, waiting for it"
    assert moved.command.generation == 2 and not book.favoured and not book.audit()
    assert [(job.command.job_id, job.node_names) for job in book.cycle(703.5)] == [("gang", ("a",))]
    assert book.release_preempted("zombie", 1, 704.0, "held") is not None
    assert [(job.command.job_id, job.node_names) for job in book.cycle(704.5)] == [("small", ("b",))]
    assert not book.audit()


def test_a_rank_preemption_clears_the_margin_the_forecasts_measured_errors_set() -> None:
    """What placement heard on kumiki.job.forecast sets the margin: the same two forecasts, ~9x apart, evict
    when both keys' errors are small and not when they are large (live, as in the simulator)."""

    def evicted(error_sigma: float) -> list[str]:
        book = PlacementBook(policy="kumiki", min_run_s=0.0)
        book.upsert_node(node("a"), healthy=True)
        for job, p50 in (("long", 20_000.0), ("short", 2_000.0)):
            book.forecast(job, RuntimeForecast(p50, 3 * p50, "m", 1, log_sigma=0.3, error_sigma=error_sigma))
        assert book.bind(gang("long", 8, preemptible=True), 0.0).job is not None
        outcome = book.bind(gang("short", 8, preemptible=True), 1_000.0)
        assert not outcome.bound
        reasons = {victim.preemption.reason for victim in book.preemptions}
        assert reasons <= {"rank"}
        return [victim.job.command.job_id for victim in book.preemptions]

    assert evicted(0.1) == ["long"]
    assert evicted(1.5) == []


def test_a_higher_tier_gang_of_pods_smaller_than_a_node_preempts_on_the_node_they_fit_together() -> None:
    book = PlacementBook(policy="kumiki", min_run_s=0.0)
    book.upsert_node(node("a"), healthy=True)
    assert book.bind(gang("filler", 6, preemptible=True), 0.0).job is not None
    outcome = book.bind(gang("urgent", 2, 2, tier=1), 10.0)
    assert not outcome.bound and outcome.reason is not None and outcome.reason.resource == "preemption"
    assert [victim.job.command.job_id for victim in book.preemptions] == ["filler"]
    assert book.release_preempted("filler", 1, 20.0) is not None
    (started,) = book.cycle(20.0)
    assert started.command.job_id == "urgent" and started.node_names == ("a", "a")
    assert not book.audit()


def test_a_running_jobs_new_forecast_reaches_the_scheduler_and_can_make_it_the_victim() -> None:
    """A job forecast short at submit reports progress that says it will run long (job.forecast again): the
    scheduler weighs the running job by the new forecast, and the waiting short job now preempts it."""
    book = PlacementBook(policy="kumiki", min_run_s=0.0)
    book.upsert_node(node("a"), healthy=True)
    for job in ("long", "short"):
        book.forecast(job, RuntimeForecast(2_000.0, 6_000.0, "m", 1, log_sigma=0.3, error_sigma=0.1))
    assert book.bind(gang("long", 8, preemptible=True), 0.0).job is not None
    assert not book.bind(gang("short", 8, preemptible=True), 1_000.0).bound
    assert book.preemptions == []  # 1000 s left of the running job's forecast, 2000 s of the waiting one's
    progress = RuntimeForecast(20_000.0, 60_000.0, "progress", 1, log_sigma=0.3, error_sigma=0.1)
    book.forecast("long", progress)
    assert book.scheduler.running["long"].view.forecast == progress
    assert book.cycle(1_001.0) == []
    assert [(victim.job.command.job_id, victim.preemption.reason) for victim in book.preemptions] == [("long", "rank")]


def test_a_waiting_jobs_forecast_re_ranks_it_in_place() -> None:
    """A forecast that arrives while its job waits (the forecast service answers the job's SUBMITTED) orders the
    queue at once, not from the job's next queueing."""
    book = PlacementBook(policy="kumiki", min_run_s=0.0)
    book.upsert_node(node("a"), healthy=True)
    assert book.bind(gang("filler", 8), 0.0).job is not None
    for job, at_s in (("first", 10.0), ("second", 20.0)):
        book.forecast(job, RuntimeForecast(20_000.0, 60_000.0, "m", 1, log_sigma=0.3, error_sigma=0.1))
        assert not book.bind(gang(job, 8), at_s).bound
    book.forecast("second", RuntimeForecast(100.0, 300.0, "m", 1, log_sigma=0.3, error_sigma=0.1))
    reranked = book.scheduler.waiting["second"].view.forecast
    assert reranked is not None and reranked.p50_s == 100.0
    book.release("filler", 1)
    assert [job.command.job_id for job in book.cycle(30.0)] == ["second"]


def test_quota_is_asked_for_held_jobs_in_the_policys_order_the_starving_first() -> None:
    """Each admission uses up what the next could have had: the cycle asks for held jobs as the queue would start
    them (here the forecast-shortest first), and for one held past the starvation limit before any other."""
    from kumiki.sched.placement import PendingReason
    from kumiki.sched.policies import STARVATION_S

    book = preemptive_book()
    for job_id, submitted in (("long", 0.0), ("short", 100.0), ("ancient", -STARVATION_S)):
        book.hold(gang(job_id, 4), PendingReason(job_id, "quota", "over-quota", ""), submitted)
    book.forecast("long", RuntimeForecast(1e6, 2e6, "m", 1, error_sigma=0.1))
    book.forecast("short", RuntimeForecast(60.0, 120.0, "m", 1, error_sigma=0.1))
    book.forecast("ancient", RuntimeForecast(4e6, 8e6, "m", 1, error_sigma=0.1))
    assert [job.command.job_id for job in book.held_jobs(200.0)] == ["ancient", "short", "long"]
    assert [job.command.job_id for job in book.held_jobs(-STARVATION_S + 50.0)] == ["short", "long", "ancient"]


def test_an_evicted_job_starves_a_full_limit_after_its_eviction_not_after_its_arrival() -> None:
    """Starvation counts from when the attempt began to wait (the queue's clock since the twenty-first step of
    design 0003; the simulator's too). Counted from its arrival, a job evicted a day after it arrived starved at
    once and evicted the job it had just made room for."""
    from kumiki.sched.policies import STARVATION_S

    book = preemptive_book()
    evicted_s = STARVATION_S + 1_000.0
    assert book.bind(gang("old", 8, preemptible=True), 0.0).job is not None
    assert book.bind(gang("filler", 8, preemptible=True), evicted_s - 500.0).job is not None
    assert not book.bind(gang("newcomer", 8, preemptible=True), evicted_s - 100.0).bound
    released = book.release_preempted("old", 1, evicted_s, beneficiary="newcomer")
    assert released is not None and "newcomer" in book.bound  # on the GPUs freed for it
    waiting = book.pending["old"]
    assert (waiting.submitted_s, waiting.waiting_since_s) == (0.0, evicted_s)  # FIFO keeps its arrival
    assert [job.command.job_id for job in book.cycle(evicted_s + 1.0)] == ["newcomer"]  # published by this pass
    assert book.preemptions == []
    assert book.scheduler.next_deadline(evicted_s + 1.0) == evicted_s + STARVATION_S
    assert book.explain("old").starves_at_s == evicted_s + STARVATION_S
    assert book.cycle(evicted_s + STARVATION_S) == []
    assert [victim.preemption.reason for victim in book.preemptions] == ["starvation"]  # the guard still acts
    assert not book.audit()


def test_a_held_next_generation_is_asked_first_as_starving_a_full_limit_after_its_eviction() -> None:
    """A preempted job's next generation quota holds back is asked in the policy's order until it has waited the
    starvation limit since its eviction; counted from its arrival a day before, it went first at once."""
    from kumiki.sched.placement import PendingReason
    from kumiki.sched.policies import STARVATION_S

    book = preemptive_book()
    evicted_s = STARVATION_S + 1_000.0
    assert book.bind(gang("old", 4, preemptible=True), 0.0).job is not None
    book.forecast("old", RuntimeForecast(1e6, 2e6, "m", 1, error_sigma=0.1))
    book.forecast("short", RuntimeForecast(60.0, 120.0, "m", 1, error_sigma=0.1))
    assert book.release_preempted("old", 1, evicted_s, denied="over its limit") is not None
    book.hold(gang("short", 4), PendingReason("short", "quota", "over-quota", ""), evicted_s + 10.0)
    assert [job.command.job_id for job in book.held_jobs(evicted_s + 20.0)] == ["short", "old"]
    assert [job.command.job_id for job in book.held_jobs(evicted_s + STARVATION_S)] == ["old", "short"]
    book.admit("old", evicted_s + 30.0)
    queued = book.scheduler.waiting["old"]
    assert queued.view.submit_s == 0.0  # its arrival still orders FIFO policies
    assert book.scheduler.next_deadline(evicted_s + 30.0) == evicted_s + STARVATION_S  # held time counts as waiting


def test_an_evicted_job_keeps_what_it_ran_and_a_new_job_goes_first() -> None:
    """Tiresias ranks by attained service. The next generation of a job evicted after 8,080 GPU-seconds (past the
    first level) waits behind a job that arrived after it with none, as in the simulator; viewed as new, it went
    first (level 0 and older), so a long job came back ahead of every short one after each eviction."""
    book = PlacementBook(policy="tiresias", min_run_s=0.0)
    book.upsert_node(node("a"), healthy=True)
    assert book.bind(gang("long", 8, preemptible=True), 0.0).job is not None
    assert not book.bind(gang("short", 8, preemptible=True), 1_000.0).bound
    assert [(victim.job.command.job_id, victim.preemption.reason) for victim in book.preemptions] == [("long", "rank")]
    assert book.release_preempted("long", 1, 1_010.0, lost_gpu_s=7_000.0) is not None
    assert book.served["long"] == ServiceSoFar(executed_s=1_010.0 - 875.0, attained_gpu_s=8_080.0, preemptions=1)
    waiting = book.scheduler.waiting["long"].view
    assert (waiting.executed_s, waiting.attained_gpu_s, waiting.preemptions) == (135.0, 8_080.0, 1)
    explained = book.explain("long")  # what an operator reads with `kumiki placement explain`
    assert (explained.status, explained.service, explained.waiting_since_s) == ("pending", book.served["long"], 1_010.0)
    assert explained.starves_at_s is None  # tiresias has no starvation guard
    assert [job.command.job_id for job in book.cycle(1_010.0)] == ["short"]
    assert not book.bind(gang("fresh", 8, preemptible=True), 1_020.0).bound
    book.release("short", 1)
    assert [job.command.job_id for job in book.cycle(1_100.0)] == ["fresh"]
    assert book.preemptions == []
    book.release("fresh", 1)
    (resumed,) = book.cycle(1_200.0)
    assert resumed.command.generation == 2 and book.scheduler.running["long"].view.attained_gpu_s == 8_080.0
    book.release("long", 2)
    book.mark_ended("long", 2)
    assert "long" not in book.served  # ended: nothing kept


def test_service_so_far_adds_each_evicted_attempt() -> None:
    service = ServiceSoFar().after_eviction(100.0, 4.0, 80.0).after_eviction(50.0, 4.0, 1_000.0)
    assert service == ServiceSoFar(executed_s=80.0, attained_gpu_s=600.0, preemptions=2)  # all of the second lost
    assert ServiceSoFar().after_eviction(-5.0, 0.0, 3.0) == ServiceSoFar(0.0, 0.0, 1)


def test_a_report_of_the_job_computing_after_its_idle_report_keeps_it_from_being_reclaimed() -> None:
    outlived = idle_book("q=waiting:0")
    outlived.gpu_idle("idle", 1, 0.0, 700.0)
    outlived.gpu_busy("idle", 1, 800.0)  # its owner came back: the idle report is history
    assert not outlived.bind(gang("next", 8), 810.0).bound and not outlived.preemptions
    assert not outlived.idle
    older = idle_book("q=waiting:0")
    older.gpu_idle("idle", 1, 0.0, 700.0)
    older.gpu_busy("idle", 1, 650.0)  # computing before it went idle: the idle report stands
    older.gpu_busy("idle", 0, 900.0)  # another attempt's report says nothing of this one
    assert not older.bind(gang("next", 8), 810.0).bound
    assert [victim.preemption.reason for victim in older.preemptions] == ["idle-reclaim"]


def test_an_idle_reclaimed_job_waits_behind_its_tier_until_a_later_attempt_is_found_computing() -> None:
    """FIFO, two 8-GPU nodes. The zombie arrived first, so only its demotion puts it behind later arrivals; a
    report that its next attempt computes lifts it, even one read after that attempt was evicted in turn."""
    book = PlacementBook(policy="fifo", min_run_s=0.0)
    for name in ("a", "b"):
        book.upsert_node(node(name), healthy=True)
    book.idle_policies = parse_idle_reclaim("*=waiting:0")
    assert book.bind(gang("filler", 8), 0.0).job is not None
    assert book.bind(gang("zombie", 8, preemptible=True), 0.0).job is not None
    book.gpu_idle("zombie", 1, 0.0, 700.0)
    assert not book.bind(gang("next", 8), 700.0).bound
    assert book.release_preempted("zombie", 1, 710.0) is not None
    assert [job.command.job_id for job in book.cycle(711.0)] == ["next"]
    assert not book.bind(gang("later", 8), 720.0).bound

    def positions() -> list[tuple[str, int]]:
        waiting = sorted(book.pending, key=lambda job: book.explain(job).queue_position)
        return [(job, book.pending[job].command.generation) for job in waiting]

    assert positions() == [("later", 1), ("zombie", 2)] and book.explain("zombie").service.demoted
    book.gpu_busy("zombie", 1, 720.0)  # the reclaimed attempt's own report proves nothing of the next
    assert positions() == [("later", 1), ("zombie", 2)]
    book.release("next", 1)
    assert [job.command.job_id for job in book.cycle(730.0)] == ["later"]
    book.release("filler", 1)
    assert [(job.command.job_id, job.command.generation) for job in book.cycle(740.0)] == [("zombie", 2)]
    assert not book.bind(gang("another", 8), 810.0).bound
    assert book.release_preempted("zombie", 2, 820.0, cause="priority") is not None  # evicted for another reason
    assert positions() == [("another", 1), ("zombie", 3)]  # still demoted: nothing said generation 2 computed
    book.gpu_busy("zombie", 2, 815.0)  # ... until telemetry's report of it arrives, late
    assert positions() == [("zombie", 3), ("another", 1)]  # its arrival puts it first again
    explained = book.explain("zombie")
    assert (explained.queue_position, explained.service.idle_reclaims, explained.service.demoted) == (1, 1, False)
    assert book.scheduler.waiting["zombie"].view.demoted == 0
    assert not book.audit()


def test_service_so_far_is_demoted_from_an_idle_reclaim_until_a_later_generation_computes() -> None:
    reclaimed = ServiceSoFar().after_eviction(100.0, 8.0, 0.0, idle_reclaim=True, generation=1)
    assert reclaimed.demoted and reclaimed.computing(1).demoted  # its own attempt: not a later one
    lifted = reclaimed.computing(2)
    assert not lifted.demoted and lifted.idle_reclaims == 1  # the count stays for Explain
    assert not lifted.after_eviction(50.0, 8.0, 0.0, generation=2).demoted  # evicted for another reason
    assert lifted.after_eviction(50.0, 8.0, 0.0, idle_reclaim=True, generation=2).demoted  # idle again
    assert not ServiceSoFar().computing(3).demoted  # never reclaimed: nothing to lift


def test_a_busy_report_is_kept_while_the_job_lasts_and_not_after_it_ended() -> None:
    book = preemptive_book()
    assert book.bind(gang("done", 4), 0.0).job is not None
    book.gpu_busy("done", 1, 100.0)
    assert book.served["done"].computing_generation == 1
    book.release("done", 1)
    book.mark_ended("done", 1)
    assert "done" not in book.served  # forgotten with the job
    book.gpu_busy("done", 1, 200.0)  # telemetry's report of it, read late
    assert "done" not in book.served
