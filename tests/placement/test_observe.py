"""Placement's fragmentation and pending-reason figures, read off a real book (pure)."""

from __future__ import annotations

from kumiki.placement.core import BindCommand, PlacementBook
from kumiki.placement.observe import book_stranded_gpus, pending_by_reason
from kumiki.sched.cluster import NodeSpec
from kumiki.sched.jobs import GangRequest, PodRequest


def node(name: str, gpus: int = 8, model: str = "A100-80GB") -> NodeSpec:
    return NodeSpec(name=name, gpus=gpus, gpu_model=model, gpu_memory_gb=80.0)


def gang(job: str, *gpus: int, model: str = "") -> BindCommand:
    request = GangRequest(job, tuple(PodRequest(gpus=count, gpu_model=model) for count in gpus))
    return BindCommand(job_id=job, generation=1, queue="q", request=request)


def book_with(*nodes: NodeSpec) -> PlacementBook:
    book = PlacementBook(policy="fifo")
    for spec in nodes:
        book.upsert_node(spec, healthy=True)
    return book


def test_free_gpus_no_waiting_pod_fits_are_stranded_per_shape() -> None:
    book = book_with(node("a"), node("b"), node("h", model="H100-80GB"))
    assert book.bind(gang("fill-a", 5), 0).bound  # a: 3 free
    assert book.bind(gang("fill-b", 5), 0).bound  # b: 3 free
    assert book_stranded_gpus(book) == {"8x A100-80GB": 0, "8x H100-80GB": 0}, "nothing waits: nothing stranded"
    # a gang of two 4-GPU A100 pods cannot start: the 3 free GPUs on a and b are stranded; h's 8 are the
    # wrong model for it, so they are stranded too
    outcome = book.bind(gang("waits", 4, 4, model="A100-80GB"), 1)
    assert not outcome.bound
    assert book_stranded_gpus(book) == {"8x A100-80GB": 6, "8x H100-80GB": 8}
    # a 2-GPU pod of any model waiting too: every node can take it, nothing is stranded for it
    book.hold(gang("small", 2), outcome.reason, 2)  # type: ignore[arg-type]
    assert book_stranded_gpus(book)["8x A100-80GB"] == 6, "a job held by quota does not wait for capacity"
    # FIFO without backfill: a 2-GPU pod queues behind the gang, and every node could take it
    assert not book.bind(gang("queued-small", 2), 3).bound
    assert book_stranded_gpus(book) == {"8x A100-80GB": 0, "8x H100-80GB": 0}


def test_unhealthy_nodes_are_not_counted_and_reasons_are_counted() -> None:
    book = book_with(node("a"), node("b", gpus=4))
    assert book.bind(gang("big", 8), 0).bound
    assert not book.bind(gang("bigger", 8), 1).bound  # waits: b has 4 free, a none
    assert book_stranded_gpus(book) == {"8x A100-80GB": 0, "4x A100-80GB": 4}
    book.upsert_node(node("b", gpus=4), healthy=False)
    assert book_stranded_gpus(book) == {"8x A100-80GB": 0, "4x A100-80GB": 0}, "a sick node's GPUs are not free"
    reasons = pending_by_reason(book.pending.values())
    assert sum(reasons.values()) == 1 and len(reasons) == 1
