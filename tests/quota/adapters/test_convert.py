"""Wire ⇄ quota core: Admit requests validated into core requests (each bad field named), admissions and
statuses into messages, and job.lifecycle states onto the ledger's LifecycleState."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kumiki.common.contracts.v1 import common_pb2, events_pb2, quota_pb2
from kumiki.common.grpcutil import InvalidRequest
from kumiki.quota.adapters.convert import (
    admission_response,
    admit_request,
    lifecycle_state,
    quota_state,
    reclaim_event,
    usage_response,
)
from kumiki.quota.adapters.store import UsageRow
from kumiki.quota.core import Admission, AdmitRequest, Effect, LifecycleState, Outcome, QueueStatus, lifecycle_effect


def admit(**fields: object) -> quota_pb2.AdmitRequest:
    base: dict[str, object] = {"job": common_pb2.JobRef(job_id="team/j", generation=2), "queue": "org/team", "gpus": 4}
    base.update(fields)
    return quota_pb2.AdmitRequest(**base)  # type: ignore[arg-type]


def test_a_valid_admit_request_becomes_the_core_request_field_for_field() -> None:
    request = admit(gpu_model="A100", priority_tier=3, preemptible=True, gpus=0.5)
    assert admit_request(request) == AdmitRequest("team/j", 2, "org/team", 0.5, "A100", 3, True)
    assert admit_request(admit(gpus=0)).gpu_model == ""  # "" is any model


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"job": common_pb2.JobRef(generation=1)}, "job.job_id: required"),
        ({"job": common_pb2.JobRef(job_id="j")}, "job.generation: must be >= 1"),
        (
            {"job": common_pb2.JobRef(job_id="j", generation=2**63)},
            "job.generation: must be <= 9223372036854775807, got 9223372036854775808",
        ),
        ({"job": common_pb2.JobRef(job_id="j", generation=1), "queue": ""}, "queue: required"),
        ({"queue": "", "job": common_pb2.JobRef()}, "job.job_id: required"),  # the job is checked first
        ({"gpus": float("nan")}, "gpus: must be a finite number >= 0, got nan"),
        ({"gpus": float("inf")}, "gpus: must be a finite number >= 0, got inf"),
        ({"gpus": -1}, "gpus: must be a finite number >= 0, got -1.0"),
    ],
)
def test_a_bad_admit_field_is_named(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        admit_request(admit(**fields))
    assert str(raised.value) == message
    assert raised.value.field == message.split(":")[0]


@pytest.mark.parametrize(
    ("outcome", "admitted", "borrowed"),
    [(Outcome.ADMITTED, True, False), (Outcome.BORROWED, True, True), (Outcome.DENIED, False, False)],
)
def test_admission_response_carries_outcome_and_reason(outcome: Outcome, admitted: bool, borrowed: bool) -> None:
    response = admission_response(Admission(outcome, "some_code", "why it went so", "queue"))
    assert (response.admitted, response.borrowed) == (admitted, borrowed)
    assert response.reason == common_pb2.PendingReason(code="some_code", resource="queue", message="why it went so")


OPENS = {events_pb2.JOB_STATE_BOUND, events_pb2.JOB_STATE_RUNNING}
CLOSES = {
    events_pb2.JOB_STATE_COMPLETED,
    events_pb2.JOB_STATE_FAILED,
    events_pb2.JOB_STATE_PREEMPTED,
    events_pb2.JOB_STATE_RELEASED,
}


@pytest.mark.parametrize("state", [*events_pb2.JobState.values(), -1, 11, 99, 2**31 - 1])
def test_every_wire_state_has_the_ledger_effect_it_had(state: int) -> None:
    """BOUND and RUNNING open the meter; completed, failed, preempted and released close it; every other
    state, one this build does not know included, is OTHER and does nothing."""
    expected = Effect.OPEN if state in OPENS else Effect.CLOSE if state in CLOSES else Effect.NONE
    assert lifecycle_effect(lifecycle_state(state)) is expected
    if expected is Effect.NONE:
        assert lifecycle_state(state) is LifecycleState.OTHER
    else:
        assert lifecycle_state(state).name == events_pb2.JobState.Name(state).removeprefix("JOB_STATE_")


def test_usage_and_quota_state_messages_carry_every_field() -> None:
    row = UsageRow("org/team", "A100", 1, Decimal("7200.5"), Decimal("4.25"))
    response = usage_response([row])
    assert list(response.usage) == [
        quota_pb2.QueueUsage(queue="org/team", gpu_model="A100", priority_tier=1, gpu_seconds=7200.5, cost=4.25)
    ]
    message = quota_state(QueueStatus("org/team", 8.0, 16.0, 6.0, 2.0, 1.0, 7.5), version=42)
    assert (message.queue, message.guaranteed_gpus, message.limit_gpus, message.used_gpus) == ("org/team", 8, 16, 6)
    assert (message.borrowed_gpus, message.lent_gpus, message.fair_share_gpus) == (2, 1, 7.5)
    assert message.version.version == 42 and message.version.observed_at.seconds > 0


def test_reclaim_event_names_victim_beneficiary_and_why() -> None:
    row: dict[str, object] = {
        "decision_id": "d-1",
        "victim_job": "batch/v",
        "victim_generation": 3,
        "victim_queue": "org/batch",
        "beneficiary_job": "team/b",
        "beneficiary_generation": 1,
        "beneficiary_queue": "org/team",
        "gpus": 2.5,
    }
    event = reclaim_event(row)
    assert event.kind == events_pb2.DECISION_KIND_RECLAIM and event.decision_id == "d-1"
    assert (event.job.job_id, event.job.generation, event.queue) == ("batch/v", 3, "org/batch")
    assert (event.beneficiary.job_id, event.beneficiary.generation) == ("team/b", 1)
    assert event.reasons[0].code == "reclaim" and "borrowed 2.5 GPUs" in event.reasons[0].message
    assert event.policy == "kumiki-quota"
