"""kumiki.telemetry.core.idle: folding chunks into a node record: idle findings once per episode, busy findings
once per holding and again after each idle episode, usage."""

from __future__ import annotations

import pytest

from kumiki.telemetry import core
from tests.telemetry.core.support import feed, feed_busy, fold, hold, inventory, reading


def test_a_job_below_threshold_for_the_duration_is_reported_once_and_a_busy_job_never() -> None:
    record = hold(hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "idle-job", (0,)), "n1", "busy-job", (1,))
    findings: list[core.IdleFinding] = []
    for t in range(0, 121, 10):
        record, found, _ = feed(record, [reading("n1", 0, 1000.0 + t, 2.0), reading("n1", 1, 1000.0 + t, 95.0)])
        findings += found
    assert [(f.job_id, f.gpu_uuids, f.since) for f in findings] == [("idle-job", ("GPU-n1-0",), 1000.0)]
    assert findings[0].until - findings[0].since >= 60.0
    assert findings[0].mean_utilization_pct == pytest.approx(2.0)


def test_a_busy_sample_ends_the_episode_and_a_later_idle_stretch_is_a_new_one() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "job", (0,))
    utils = [1.0] * 8 + [80.0] + [1.0] * 8
    findings: list[core.IdleFinding] = []
    for k, util in enumerate(utils):
        record, found, _ = feed(record, [reading("n1", 0, 1000.0 + 10 * k, util)])
        findings += found
    assert [f.since for f in findings] == [1000.0, 1090.0]


def test_every_gpu_of_the_job_must_be_idle_even_when_their_samples_arrive_apart() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    for t in range(0, 121, 10):  # GPU 1 is busy: no finding, however long GPU 0 idles
        record, found, _ = feed(record, [reading("n1", 0, 1000.0 + t, 1.0)])
        assert found == []
        record, found, _ = feed(record, [reading("n1", 1, 1000.0 + t, 60.0)])
        assert found == []
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    findings: list[core.IdleFinding] = []
    for t in range(0, 121, 10):
        for index in (0, 1):
            record, found, _ = feed(record, [reading("n1", index, 2000.0 + t + index, 1.0)])
            findings += found
    assert len(findings) == 1 and set(findings[0].gpu_uuids) == {"GPU-n1-0", "GPU-n1-1"}
    assert findings[0].idle_gpu_seconds == pytest.approx(2 * (findings[0].until - findings[0].since))


def test_per_queue_thresholds() -> None:
    findings = {}
    for queue in ("lenient", "strict"):
        record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "job", (0,), queue=queue)
        found_all = []
        for t in range(0, 121, 10):
            record, found, _ = feed(record, [reading("n1", 0, 1000.0 + t, 30.0)])
            found_all += found
        findings[queue] = found_all
    assert len(findings["lenient"]) == 1 and findings["strict"] == []


def test_usage_counts_allocated_used_and_idle_gpu_seconds_between_samples() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    record, _, first = feed(record, [reading("n1", 0, 1000.0, 50.0), reading("n1", 1, 1000.0, 2.0)])
    assert first == []  # no previous sample: no time to account yet
    _, _, usages = feed(record, [reading("n1", 0, 1010.0, 50.0), reading("n1", 1, 1010.0, 2.0)])
    (usage,) = usages
    assert usage.job_id == "job" and usage.queue == "q"
    assert usage.aggregate.allocated_gpu_s == pytest.approx(20.0)
    assert usage.aggregate.used_gpu_s == pytest.approx(10 * 0.5 + 10 * 0.02)
    assert usage.aggregate.idle_gpu_s == pytest.approx(10.0)


def test_a_redelivered_chunk_is_not_counted_twice() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "job", (0,))
    record, _, _ = feed(record, [reading("n1", 0, 1000.0, 50.0)])
    record, _, usages = feed(record, [reading("n1", 0, 1010.0, 50.0)])
    again, _, replayed = feed(record, [reading("n1", 0, 1010.0, 50.0)])
    assert len(usages) == 1 and replayed == [] and again == record


def test_a_new_holder_is_idle_only_from_its_own_hold() -> None:
    # a zombie idles 120 s and is reported; it is evicted and bound again (generation 2) with no sample between
    record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "zombie", (0,))
    findings: list[core.IdleFinding] = []
    for t in range(0, 121, 10):
        record, found, _ = feed(record, [reading("n1", 0, 1000.0 + t, 1.0)])
        findings += found
    assert [f.generation for f in findings] == [1]
    record = core.apply_allocation(record, core.AllocationChange("n1", "zombie", 1, "q", (), False))
    record = hold(record, "n1", "zombie", (0,), generation=2)
    record, found, _ = feed(record, [reading("n1", 0, 1130.0, 1.0)])
    assert found == []  # not idle since 1000: its hold began after the last sample
    later: list[core.IdleFinding] = []
    for t in range(140, 261, 10):
        record, found, _ = feed(record, [reading("n1", 0, 1000.0 + t, 1.0)])
        later += found
    assert [(f.generation, f.since) for f in later] == [(2, 1130.0)]


def _busy_over(
    record: core.NodeRecord, utils: list[float], start: float = 1000.0, index: int = 0
) -> list[core.BusyFinding]:
    findings: list[core.BusyFinding] = []
    for k, util in enumerate(utils):
        record, found = feed_busy(record, [reading("n1", index, start + 10 * k, util)])
        findings += found
    return findings


def test_a_computing_job_is_reported_busy_once_after_a_stretch_as_long_as_its_idle_rule_and_a_zombie_never() -> None:
    record = hold(hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "zombie", (0,)), "n1", "worker", (1,))
    findings: list[core.BusyFinding] = []
    for t in range(0, 301, 10):
        record, found = feed_busy(record, [reading("n1", 0, 1000.0 + t, 1.0), reading("n1", 1, 1000.0 + t, 90.0)])
        findings += found
    assert [(f.job_id, f.gpu_uuids, f.since, f.until) for f in findings] == [("worker", ("GPU-n1-1",), 1000.0, 1060.0)]
    assert findings[0].mean_utilization_pct == pytest.approx(90.0)
    assert findings[0].event_id == "gpu-busy/worker/1/n1/1000.000"


def test_a_job_computing_in_bursts_is_busy_and_a_zombies_flicker_is_not() -> None:
    bursts = [0.0, 0.0, 40.0, 0.0, 0.0, 40.0, 0.0]  # mean over the stretch about 13%, above the 5% threshold
    record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "job", (0,))
    assert [f.since for f in _busy_over(record, bursts)] == [1000.0]
    flicker = [1.0, 1.0, 1.0, 20.0, 1.0, 1.0, 1.0] * 3  # one sample in six above it: a mean of about 4%
    assert _busy_over(record, flicker) == []


def test_a_job_found_idle_is_reported_busy_again_when_it_computes() -> None:
    # busy, then idle long enough for gpu.idle, then computing again (its owner came back): busy, idle, busy
    record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "job", (0,))
    utils = [80.0] * 8 + [1.0] * 10 + [80.0] * 10
    kinds = []
    for k, util in enumerate(utils):
        record, found, _ = fold(record, [reading("n1", 0, 1000.0 + 10 * k, util)])
        kinds += [(f.KIND, f.since) for f in found]
    assert kinds == [("gpu-busy", 1000.0), ("gpu-idle", 1080.0), ("gpu-busy", 1140.0)]


def test_per_queue_thresholds_decide_busy_as_they_decide_idle() -> None:
    found = {}
    for queue in ("lenient", "strict"):  # 50% and 5%
        record = hold(core.apply_inventory(None, inventory("n1", 1)), "n1", "job", (0,), queue=queue)
        found[queue] = _busy_over(record, [30.0] * 13)
    assert found["lenient"] == [] and len(found["strict"]) == 1


def test_each_generation_is_reported_busy_on_its_own_and_the_stretch_survives_a_restart() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    findings: list[core.BusyFinding] = []
    for t in range(0, 31, 10):
        record, found = feed_busy(record, [reading("n1", i, 1000.0 + t, 70.0) for i in (0, 1)])
        findings += found
    record = core.NodeRecord.from_json(record.to_json())  # a restarted worker reads its table's changelog
    for t in range(40, 81, 10):
        record, found = feed_busy(record, [reading("n1", i, 1000.0 + t, 70.0) for i in (0, 1)])
        findings += found
    assert [(f.generation, f.since, f.until, len(f.gpu_uuids)) for f in findings] == [(1, 1000.0, 1060.0, 2)]
    record = core.apply_allocation(record, core.AllocationChange("n1", "job", 1, "q", (), False))
    record = hold(record, "n1", "job", (0,), generation=2)
    later: list[core.BusyFinding] = []
    for t in range(90, 181, 10):
        record, found = feed_busy(record, [reading("n1", 0, 1000.0 + t, 70.0)])
        later += found
    assert [(f.generation, f.since) for f in later] == [(2, 1080.0)]  # held since the sample before its first
