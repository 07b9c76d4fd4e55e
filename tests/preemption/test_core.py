"""The coordinator's protocol rules, pure: every phase, the deadline, lost work, repeats and stale inputs."""

from __future__ import annotations

import pytest

from kumiki.preemption import core
from kumiki.preemption.core import Action, CheckpointRecord, Phase, PreemptRequest

REQUEST = PreemptRequest("team/a", 1, "team", 4.0, "priority", "d-1", bound_unix_s=1000.0, beneficiary="team/b")


def started(now: float = 2000.0, deadline: float = 60.0) -> core.Protocol:
    transition = core.begin(None, REQUEST, now, deadline)
    assert transition is not None
    return transition.protocol


def test_begin_asks_for_a_checkpoint_with_a_deadline_once_per_attempt() -> None:
    transition = core.begin(None, REQUEST, 2000.0, 60.0)
    assert transition is not None
    assert transition.protocol.phase is Phase.CHECKPOINTING and transition.protocol.deadline_unix_s == 2060.0
    (command,) = transition.effects
    assert isinstance(command, core.Command) and command.action is Action.CHECKPOINT
    assert command.command_id == "team/a/1/checkpoint"
    assert core.begin(transition.protocol, REQUEST, 2001.0, 60.0) is None  # a repeated decision: nothing new


def test_unknown_reason_is_reported_as_other_and_zero_deadline_evicts_at_once() -> None:
    transition = core.begin(None, PreemptRequest("j", 1, "q", 1.0, "whim", "d", 10.0), 20.0, 0.0)
    assert transition is not None
    assert transition.protocol.reason == "other" and transition.protocol.phase is Phase.EVICTING
    assert transition.protocol.forced and transition.protocol.lost_gpu_seconds == 10.0


def test_acknowledgement_evicts_and_releases_losing_only_the_moments_since_it() -> None:
    protocol = started()
    ack = CheckpointRecord("team/a", 1, "file:///c/200", 200, 2010.0)
    transition = core.acknowledge(protocol, ack, 2010.5)
    assert transition.protocol.phase is Phase.EVICTING and not transition.protocol.forced
    assert transition.protocol.lost_gpu_seconds == pytest.approx(2.0)  # 0.5 s x 4 GPUs
    assert transition.protocol.checkpoint_uri == "file:///c/200" and transition.protocol.checkpoint_step == 200
    command, release = transition.effects
    assert isinstance(command, core.Command) and command.action is Action.EVICT
    assert release == core.Release("team/a", 1, pytest.approx(2.0))


def test_a_checkpoint_older_than_the_command_or_of_another_attempt_is_no_answer() -> None:
    protocol = started()
    assert not core.acknowledge(protocol, CheckpointRecord("team/a", 1, "u", 100, 1990.0), 2010.0).changed
    assert not core.acknowledge(protocol, CheckpointRecord("team/a", 2, "u", 100, 2005.0), 2010.0).changed


def test_deadline_forces_eviction_and_counts_work_since_the_last_checkpoint() -> None:
    protocol = started()
    periodic = CheckpointRecord("team/a", 1, "file:///c/150", 150, 1900.0)
    assert not core.expire(protocol, periodic, 2059.9).changed  # not yet
    transition = core.expire(protocol, periodic, 2060.0)
    assert transition.protocol.forced and transition.protocol.phase is Phase.EVICTING
    assert transition.protocol.lost_gpu_seconds == pytest.approx((2060.0 - 1900.0) * 4)
    assert transition.protocol.checkpoint_uri == "file:///c/150"
    # without any checkpoint: everything since the bind
    assert core.expire(protocol, None, 2060.0).protocol.lost_gpu_seconds == pytest.approx(1060.0 * 4)
    # an acknowledgement after the forced eviction changes nothing
    late = core.acknowledge(transition.protocol, CheckpointRecord("team/a", 1, "u", 300, 2061.0), 2061.0)
    assert not late.changed


def test_release_then_the_next_generation_bound_gets_resume_with_the_checkpoint() -> None:
    evicted = core.acknowledge(started(), CheckpointRecord("team/a", 1, "file:///c/200", 200, 2010.0), 2010.0).protocol
    assert not core.rebound(evicted, 1).changed  # the same attempt is no resumption
    requeued = core.released(evicted).protocol
    assert requeued.phase is Phase.REQUEUED
    assert not core.released(requeued).changed
    transition = core.rebound(requeued, 2)
    assert transition.protocol.phase is Phase.RESUMED and transition.protocol.resume_generation == 2
    (command,) = transition.effects
    assert isinstance(command, core.Command)
    assert (command.action, command.generation, command.protocol_generation) == (Action.RESUME, 2, 1)
    assert not core.rebound(transition.protocol, 3).changed  # resumed once
    # the bind can be read before the release call returned: it implies the release
    assert core.rebound(evicted, 2).protocol.phase is Phase.RESUMED


def test_an_attempt_that_ends_on_its_own_closes_its_protocol() -> None:
    protocol = started()
    assert not core.ended(protocol, 2).changed
    assert core.ended(protocol, 1).protocol.phase is Phase.CANCELLED
    assert not core.expire(core.ended(protocol, 1).protocol, None, 9999.0).changed


def test_a_watch_stream_gets_the_commands_still_relevant_to_its_attempt() -> None:
    protocol = started()
    assert core.commands_to_watch(None, 1) == ()
    assert core.commands_to_watch(protocol, 1) == (Action.CHECKPOINT,)
    evicted = core.expire(protocol, None, 2060.0).protocol
    assert core.commands_to_watch(evicted, 1) == (Action.EVICT,)
    resumed = core.rebound(core.released(evicted).protocol, 2).protocol
    assert core.commands_to_watch(resumed, 2) == (Action.RESUME,)
    assert core.commands_to_watch(resumed, 3) == ()


def test_request_validation_names_the_field() -> None:
    bad = PreemptRequest("", 0, "q", -1.0, "priority", "", 0.0)
    assert [field for field, _ in core.validate_request(bad)] == ["job.job_id", "job.generation", "gpus", "decision_id"]
    # the reason becomes a metric label and the PREEMPTED event's reason: a code, never free text
    for reason in ("Priority", "idle reclaim", "x" * 65, "", "idle-reclaim\n"):
        problems = core.validate_request(PreemptRequest("j", 1, "q", 1.0, reason, "d", 0.0))
        assert [field for field, _ in problems] == ["preemption_reason"], reason
    assert core.validate_request(PreemptRequest("j", 1, "q", 1.0, "idle-reclaim", "d", 0.0)) == []
