"""Placement's book, pure: idempotent binds, gangs whole or not at all, topology, node health, rebuild, Explain."""

from __future__ import annotations

import pytest

from kumiki.placement.core import BindConflict, PlacementBook
from kumiki.sched.cluster import NodeSpec, PodPlacement
from tests.placement.core.helpers import gang, node


def book_with(*nodes: NodeSpec) -> PlacementBook:
    book = PlacementBook()
    for spec in nodes:
        book.upsert_node(spec, healthy=True)
    return book


def held_gpus(book: PlacementBook) -> list[tuple[str, int]]:
    return [
        (name, gpu)
        for job in book.bound.values()
        for name, pod in zip(job.node_names, job.placement.pods, strict=True)
        for gpu in pod.gpus
    ]


def test_same_job_and_generation_gets_the_same_answer() -> None:
    book = book_with(node("a"), node("b"))
    first = book.bind(gang("j", 4), 0.0)
    again = book.bind(gang("j", 4), 0.0)
    assert first.bound and again.replayed
    assert again.job == first.job
    assert len(held_gpus(book)) == 4


def test_generations_are_ordered() -> None:
    book = book_with(node("a"))
    book.bind(gang("j", 2, generation=2), 0.0)
    with pytest.raises(BindConflict, match="older than the bound generation 2"):
        book.bind(gang("j", 2, generation=1), 0.0)
    with pytest.raises(BindConflict, match="release it first"):
        book.bind(gang("j", 2, generation=3), 0.0)
    assert book.release("j", 2) is not None
    assert book.bind(gang("j", 2, generation=3), 0.0).bound


def test_an_ended_generation_never_binds_again_and_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kumiki.placement.core.book.ENDED_KEPT", 2)
    book = book_with(node("a"))
    assert book.bind(gang("j", 2), 0.0).bound
    assert book.release("j", 1) is not None
    book.mark_ended("j", 1)
    with pytest.raises(BindConflict, match="generation 1 of this job already ran to its end"):
        book.bind(gang("j", 2), 1.0)
    assert held_gpus(book) == []
    book.mark_ended("k", 3)
    book.mark_ended("j", 1)  # the newest ending is kept longest
    book.mark_ended("m", 1)
    assert list(book.ended) == ["j", "m"]
    assert book.bind(gang("k", 1, generation=3), 2.0).bound  # forgotten: only the newest ENDED_KEPT are refused
    assert book.bind(gang("j", 2, generation=2), 2.0).bound


def test_two_large_gangs_one_runs_one_waits_nothing_half_placed() -> None:
    """volcano-sh/volcano#3373: two gangs that each need most of the cluster, submitted together."""
    book = book_with(node("a"), node("b"), node("c"))
    first = book.bind(gang("big-1", 8, 8), 0.0)
    second = book.bind(gang("big-2", 8, 8), 0.0)
    assert first.bound and not second.bound
    assert set(book.bound) == {"big-1"} and set(book.pending) == {"big-2"}
    assert len(held_gpus(book)) == 16, "the waiting gang holds nothing"
    assert second.reason is not None and "gang all-or-nothing: only 1 of 2 pods fit" in second.reason.constraint
    book.release("big-1", 1)
    assert [job.command.job_id for job in book.cycle(1.0)] == ["big-2"]
    assert set(book.bound) == {"big-2"} and not book.pending


def test_unhealthy_and_removed_nodes_get_no_work() -> None:
    book = book_with(node("a"), node("b"))
    book.upsert_node(node("a"), healthy=False)
    assert book.bind(gang("j1", 8), 0.0).job.node_names == ("b",)  # type: ignore[union-attr]
    book.remove_node("b")
    outcome = book.bind(gang("j2", 1), 0.0)
    assert not outcome.bound
    assert "j1" in book.bound, "a job on a node that left keeps its record until it is released"


def filler(book: PlacementBook, job: str, node_name: str, gpus: tuple[int, ...]) -> None:
    """Occupy exact GPUs (through the rebuild path) so topology scenarios are deterministic."""
    command = gang(job, len(gpus))
    assert book.restore(command, [(node_name, PodPlacement(0, 0, gpus))]) is not None


def test_required_rack_is_never_broken() -> None:
    book = book_with(node("a", rack="r0"), node("b", rack="r1"))
    filler(book, "fa", "a", (0, 1, 2, 3))
    filler(book, "fb", "b", (0, 1, 2, 3))
    across = book.bind(gang("one-rack", 4, 4, topology="rack"), 0.0)
    assert not across.bound and across.reason is not None
    assert across.reason.resource == "topology:rack" and "several racks" in across.reason.constraint
    book.withdraw("one-rack")  # else fifo-backfill keeps its reservation and the next gang waits behind it
    preferred = book.bind(
        gang(
            "prefer-rack",
            4,
            4,
        ),
        0.0,
    )
    assert preferred.bound and set(preferred.job.node_names) == {"a", "b"}  # type: ignore[union-attr]


def test_required_node_is_never_broken() -> None:
    book = book_with(node("a"), node("b"))
    filler(book, "fa", "a", (0, 1, 2, 3))
    filler(book, "fb", "b", (0, 1, 2, 3))
    split = book.bind(gang("one-node", 3, 3, topology="node"), 0.0)
    assert not split.bound and split.reason is not None and split.reason.resource == "topology:node"
    book.withdraw("one-node")
    fits = book.bind(gang("fits-one-node", 2, 2, topology="node"), 0.0)
    assert fits.bound and len(set(fits.job.node_names)) == 1  # type: ignore[union-attr]


def test_required_nvlink_island_is_never_broken() -> None:
    book = book_with(node("a", islands=((0, 1, 2, 3), (4, 5, 6, 7))))
    filler(book, "fa", "a", (0, 1, 4, 5))  # free: 2, 3 in island 0 and 6, 7 in island 1
    spans = book.bind(gang("three", 3, topology="nvlink_island"), 0.0)
    assert not spans.bound and spans.reason is not None
    assert spans.reason.resource == "topology:nvlink_island" and "span islands" in spans.reason.constraint
    book.withdraw("three")
    pair = book.bind(gang("pair", 2, topology="nvlink_island"), 0.0)
    assert pair.bound
    assert set(pair.job.placement.pods[0].gpus) in ({2, 3}, {6, 7})  # type: ignore[union-attr]


def test_rebuild_from_the_log_reproduces_the_table() -> None:
    book = book_with(node("a"), node("b"))
    for index, size in enumerate((3, 5, 2, 6)):
        book.bind(gang(f"j{index}", size), 0.0)
    book.release("j1", 1)
    log = [(job.command, list(zip(job.node_names, job.placement.pods, strict=True))) for job in book.bound.values()]
    rebuilt = book_with(node("a"), node("b"))
    for command, pods in log:
        rebuilt.restore(command, pods)
    assert sorted(held_gpus(rebuilt)) == sorted(held_gpus(book))
    assert rebuilt.audit() == []
    assert rebuilt.bind(gang("j2", 2), 0.0).replayed


def test_binds_recorded_before_their_node_arrive_are_adopted() -> None:
    source = book_with(node("late"))
    job = source.bind(gang("early", 4), 0.0).job
    assert job is not None
    book = PlacementBook()
    book.restore(job.command, list(zip(job.node_names, job.placement.pods, strict=True)))
    assert "early" not in book.bound and "early" in book.orphans
    book.upsert_node(node("late"), healthy=True)
    assert "early" in book.bound and book.audit() == []
    assert not book.bind(gang("other", 8), 0.0).bound, "the adopted job's GPUs are taken"


def test_shrunk_node_displaces_jobs_that_no_longer_fit() -> None:
    book = book_with(node("a"))
    book.bind(gang("small", 2), 0.0)
    book.bind(gang("large", 6), 0.0)
    displaced = book.upsert_node(node("a", gpus=4), healthy=True)
    assert [job.command.job_id for job in displaced] == ["large"]
    assert set(book.bound) == {"small"} and book.audit() == []


def test_explain_names_resource_node_shape_and_queue_position() -> None:
    book = book_with(node("a"), node("b"))
    book.bind(gang("running", 8), 0.0)
    book.bind(gang("wait-1", 8, 8), 0.0)
    book.bind(gang("wait-2", 4, 4, 4), 0.0)
    explanation = book.explain("wait-2")
    assert explanation.status == "pending" and explanation.queue_position == 2
    reason = explanation.reasons[0]
    assert reason.resource == "gpu"
    assert "4 GPU" in reason.node_shape
    assert book.explain("running").status == "bound"
    assert book.explain("nobody").status == "unknown"


def test_priority_tiers_order_pending_jobs() -> None:
    book = book_with(node("a"))
    book.bind(gang("running", 8), 0.0)
    book.bind(gang("low", 8, tier=0), 1.0)
    book.bind(gang("high", 8, tier=5), 2.0)
    assert book.explain("high").queue_position == 1 and book.explain("low").queue_position == 2
    book.release("running", 1)
    assert [job.command.job_id for job in book.cycle(3.0)] == ["high"], "the higher tier goes first, though later"


def test_queue_position_is_the_policys_order_then_the_jobs_quota_holds_back() -> None:
    """Under `kumiki` the forecast-shortest goes first though it came last; a job quota holds back comes after
    every queued job of its queue, and the starving held first among those (what the cycle asks quota for)."""
    from kumiki.sched.forecasting import RuntimeForecast
    from kumiki.sched.placement import PendingReason
    from kumiki.sched.policies import STARVATION_S

    book = PlacementBook(policy="kumiki", min_run_s=0.0)
    book.upsert_node(node("a"), healthy=True)
    book.bind(gang("running", 8), 0.0)
    for job_id, p50, at_s in (("long", 1e6, 1.0), ("short", 60.0, 2.0)):
        book.forecast(job_id, RuntimeForecast(p50, 2 * p50, "m", 1, error_sigma=0.1))
        assert not book.bind(gang(job_id, 8), at_s).bound
    for job_id, at_s in (("held-new", 3.0), ("held-old", -STARVATION_S)):
        book.hold(gang(job_id, 8), PendingReason(job_id, "quota", "over-quota", ""), at_s)
    positions = {job: book.explain(job, now=10.0).queue_position for job in ("short", "long", "held-old", "held-new")}
    assert positions == {"short": 1, "long": 2, "held-old": 3, "held-new": 4}
    assert book.explain("held-new").queue_position == 4  # without a clock, held jobs by arrival: held-old first


def test_a_blocked_large_gang_holds_a_reservation_small_jobs_cannot_take() -> None:
    """The core's fifo-backfill, live: without the reservation, 2-GPU jobs would keep the gang waiting forever."""
    book = book_with(node("a"), node("b"))
    book.bind(gang("running", 4), 0.0)  # a: 4 free, b: 8 free
    assert not book.bind(gang("big", 8, 8), 1.0).bound
    small = book.bind(gang("small", 2), 2.0)
    assert not small.bound and small.reason is not None
    assert small.reason.resource in ("reservation", "order"), small.reason
    book.release("running", 1)
    assert [job.command.job_id for job in book.cycle(3.0)] == ["big"]
    assert book.explain("small").status == "pending" and book.audit() == []


def test_strict_fifo_blocks_behind_its_head_and_backfill_does_not() -> None:
    for policy, small_runs in (("fifo", False), ("fifo-backfill", True)):
        book = PlacementBook(policy=policy)
        for spec in (node("a"), node("b"), node("c", gpus=2)):
            book.upsert_node(spec, healthy=True)
        book.bind(gang("running", 8), 0.0)
        assert not book.bind(gang("big", 8, 8), 1.0).bound  # needs a and b
        assert book.bind(gang("small", 2), 2.0).bound is small_runs, policy  # c is never reserved for 8-GPU pods


def test_unknown_live_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot run live"):
        PlacementBook(policy="srtf-oracle")


def test_an_ended_job_leaves_nothing_behind_but_its_ending() -> None:
    """A placement that runs for months keeps per job only what lasts as long as the job: once it has ended, its
    forecast, newest checkpoint and service so far go, and a late forecast or checkpoint report is not kept."""
    from kumiki.sched.forecasting import RuntimeForecast

    book = book_with(node("a"))
    forecast = RuntimeForecast(600.0, 1_800.0, "m", 1)
    book.bind(gang("done", 8, preemptible=True), 0.0)
    book.forecast("done", forecast)
    book.checkpointed("done", 50.0)
    assert book.release_preempted("done", 1, 100.0) is not None and "done" in book.served
    assert [job.command.generation for job in book.cycle(101.0)] == [2]
    book.release("done", 2)
    book.mark_ended("done", 2)
    assert "done" not in book.forecasts and "done" not in book.acknowledged and "done" not in book.served
    book.forecast("done", forecast)
    book.checkpointed("done", 200.0)
    assert "done" not in book.forecasts and "done" not in book.acknowledged
    assert book.bind(gang("done", 8, generation=3), 300.0).job is not None  # run again: its own again
    book.forecast("done", forecast)
    assert book.forecasts["done"] == forecast
