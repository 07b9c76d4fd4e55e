"""Placement's book with a preemptive policy, pure: victims keep their GPUs until released as PREEMPTED, what
is placed on them waits nominated, the next generation is queued, and victim choice reads acknowledged
checkpoints."""

from __future__ import annotations

from kumiki.placement.core import PlacementBook
from tests.placement.test_core import gang, node


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
