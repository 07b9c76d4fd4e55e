"""A replay that stops moving says why: when it is due, and what Placement's answer and the pods read as."""

from __future__ import annotations

from kumiki.common.contracts.v1 import common_pb2, placement_pb2
from kumiki.replay.stalls import StallWatch, placement_said, pods_said


def test_a_stall_is_due_after_the_mark_stays_while_jobs_wait_and_again_after_as_long() -> None:
    watch = StallWatch(after_s=60.0)
    assert not watch.due((1, 1), waiting=1, now=0.0)  # the first mark starts the clock
    assert not watch.due((1, 1), waiting=1, now=59.0)
    assert watch.due((1, 1), waiting=1, now=60.0)
    assert not watch.due((1, 1), waiting=1, now=119.0)  # reported: the next only after as long again
    assert watch.due((1, 1), waiting=1, now=120.0)
    assert not watch.due((2, 0), waiting=0, now=121.0)  # moved: the clock starts again
    assert not watch.due((2, 0), waiting=0, now=500.0)  # nothing waits: no stall, however quiet


def test_placement_pending_answer_with_its_reasons_and_place_in_the_queue() -> None:
    reply = placement_pb2.ExplainResponse(
        status="pending",
        queue="research",
        queue_position=3,
        reasons=[
            common_pb2.PendingReason(code="insufficient_gpus", message="no node has 8 free GPUs"),
            common_pb2.PendingReason(code="queue_order"),
        ],
    )
    assert placement_said("r1-kumiki/j00007", 1234.4, reply) == (
        "still waiting: r1-kumiki/j00007 has waited 1,234 s; placement says pending, position 3 in queue research "
        "(insufficient_gpus: no node has 8 free GPUs; queue_order)"
    )


def test_placement_bound_answer_names_the_nodes_the_replay_has_not_seen_run() -> None:
    reply = placement_pb2.ExplainResponse(
        status="bound",
        assignments=[common_pb2.PodAssignment(node="kwok-1"), common_pb2.PodAssignment(node="kwok-0", pod_index=1)],
    )
    assert placement_said("ns/j00000", 50.0, reply) == (
        "still waiting: ns/j00000 has waited 50 s; placement says bound on kwok-0, kwok-1, "
        "but its run has not been seen to start"
    )
    assert (
        placement_said("x", 0.0, placement_pb2.ExplainResponse())
        == "still waiting: x has waited 0 s; placement says nothing"
    )


def test_each_pod_says_its_node_or_why_it_has_none() -> None:
    pods = [
        {
            "metadata": {"name": "j0-g2-1"},
            "spec": {},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "GroupAlreadyPlaced",
                        "message": "the pod group was placed before this pod joined it",
                    }
                ],
            },
        },
        {"metadata": {"name": "j0-g2-0"}, "spec": {"nodeName": "kwok-0"}, "status": {"phase": "Succeeded"}},
        {"metadata": {"name": "j0-g2-2"}, "spec": {}, "status": {}},
    ]
    assert pods_said(pods) == [
        "  pod j0-g2-0: Succeeded on kwok-0",
        "  pod j0-g2-1: Pending, no node (GroupAlreadyPlaced: the pod group was placed before this pod joined it)",
        "  pod j0-g2-2: Pending, no node (not looked at yet)",
    ]
