"""The end-of-run checks on hand-made job.lifecycle logs: each violation they exist for is found, named, and a
clean log passes; the expected ledger follows the quota ledger's rules (first open, first close, once)."""

from __future__ import annotations

from decimal import Decimal

from kumiki.common.contracts.v1 import common_pb2, events_pb2
from kumiki.replay.checks import check_lifecycle, expected_ledger

BOUND, DONE, PREEMPTED = events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_COMPLETED, events_pb2.JOB_STATE_PREEMPTED


def event(job: str, generation: int, state: int, at_s: float, gpus: tuple[int, ...] = (), node: str = "n0"):  # type: ignore[no-untyped-def]
    message = events_pb2.JobLifecycle(
        job=common_pb2.JobRef(job_id=job, generation=generation), state=state, gpus=float(len(gpus) or 1)
    )
    message.at.seconds, message.at.nanos = int(at_s), round((at_s % 1) * 1e9)
    if gpus:
        message.assignments.add(node=node, gpu_indices=list(gpus))
    return message


def test_a_clean_log_with_a_preemption_passes() -> None:
    log = [
        event("a", 1, BOUND, 10, (0, 1)),
        event("b", 1, BOUND, 11, (2,)),
        event("a", 1, PREEMPTED, 20),
        event("b", 1, DONE, 21),
        event("a", 2, BOUND, 21.5, (2, 3)),
        event("a", 2, BOUND, 21.5, (2, 3)),  # republished: the same hold
        event("a", 2, DONE, 30),
    ]
    verdict = check_lifecycle(["a", "b"], log)
    assert verdict.problems == []
    assert (verdict.completed, verdict.generations, verdict.preempted) == (2, 3, 1)


def test_double_booking_lost_and_twice_run_jobs_are_named() -> None:
    log = [
        event("a", 1, BOUND, 10, (0,)),
        event("b", 1, BOUND, 12, (0,)),  # GPU 0 while a holds it
        event("a", 2, BOUND, 13, (1,)),  # a second generation while the first holds GPUs
        event("a", 1, DONE, 14),
        event("a", 2, DONE, 15),
        event("b", 1, DONE, 16),
        event("b", 2, BOUND, 17, (3,)),  # after completing
    ]
    problems = check_lifecycle(["a", "b", "c"], log).problems
    assert "n0 GPU 0: bound to b/1 while a held it" in problems
    assert "a: generation 2 bound while generation 1 still held GPUs" in problems
    assert "1 of 3 jobs never completed: c" in problems
    assert "1 jobs completed more than once: a" in problems
    assert "2 jobs bound or ended again after completing: a, b" in problems
    assert "1 bound generations never ended: b/2" in problems


def test_expected_ledger_meters_first_open_to_first_close_once() -> None:
    log = [
        event("a", 1, BOUND, 10.000001, (0, 1)),
        event("a", 1, events_pb2.JOB_STATE_RUNNING, 11),  # after a BOUND: changes nothing
        event("a", 1, PREEMPTED, 20.5),
        event("a", 1, DONE, 40),  # the generation is closed already
        event("a", 2, BOUND, 41, (0, 1)),  # still open at the end: not billed
        event("z", 1, DONE, 50),  # a close without an open
    ]
    assert expected_ledger(log) == {("a", 1): Decimal(2) * Decimal("10.499999")}
