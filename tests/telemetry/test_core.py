"""The pure core of telemetry ingest: chunks, allocations, idle detection, node state, staleness, config."""

from __future__ import annotations

import json

import pytest

from kumiki.common.config import ConfigError
from kumiki.telemetry import core
from kumiki.telemetry.core import (
    Assignment,
    IdleRule,
    Inventory,
    InventoryGpu,
    NodeRecord,
    Reading,
    TelemetryConfig,
    Transition,
)

CONFIG = TelemetryConfig(
    gpu_window_s=60,
    usage_window_s=300,
    usage_step_s=60,
    node_timeout_s=30,
    publish_interval_s=10,
    idle_default=IdleRule(5.0, 60.0),
    idle_by_queue={"lenient": IdleRule(50.0, 60.0)},
)


def reading(
    node: str,
    index: int,
    t: float,
    util: float | None,
    *,
    ecc: int | None = None,
    xids: tuple[int, ...] = (),
    mig: int | None = None,
) -> Reading:
    return Reading(node, f"GPU-{node}-{index}", index, mig, t, util, 1000, 80000, ecc, xids, "A100")


def inventory(node: str, gpus: int) -> Inventory:
    return Inventory(
        node, tuple(InventoryGpu(i, f"GPU-{node}-{i}", "A100", 81920, i // 4, False, ()) for i in range(gpus))
    )


def hold(
    record: NodeRecord | None, node: str, job: str, indices: tuple[int, ...], queue: str = "q", generation: int = 1
) -> NodeRecord:
    return core.apply_allocation(record, core.AllocationChange(node, job, generation, queue, indices, True))


def feed(record: NodeRecord, samples: list[Reading]) -> tuple[NodeRecord, list[core.IdleFinding], list[core.Usage]]:
    findings: list[core.IdleFinding] = []
    usages: list[core.Usage] = []
    for chunk in core.summarise(samples, CONFIG.bucket_s):
        record, found, used = core.apply_chunk(record, chunk, CONFIG)
        findings += found
        usages += used
    return record, findings, usages


# -- chunks -----------------------------------------------------------------------------------------


def test_summarise_groups_by_node_and_bucket_and_keeps_the_newest_values() -> None:
    samples = [
        reading("n1", 0, 100.0, 10.0),
        reading("n1", 0, 110.0, 30.0),
        reading("n1", 0, 105.0, 20.0),
        reading("n2", 0, 101.0, 50.0),
        reading("n1", 0, 125.0, 70.0),
    ]
    chunks = {(c.node, c.bucket): c for c in core.summarise(samples, 20.0)}
    assert set(chunks) == {("n1", 100.0), ("n2", 100.0), ("n1", 120.0)}
    first = chunks[("n1", 100.0)].gpus["GPU-n1-0"]
    assert (first.samples, first.util_sum, first.util_max, first.first_ts, first.last_ts, first.last_util) == (
        3,
        60.0,
        30.0,
        100.0,
        110.0,
        30.0,
    )
    assert core.NodeChunk.from_json(json.loads(json.dumps(chunks[("n1", 100.0)].to_json()))) == chunks[("n1", 100.0)]


def test_mig_instances_are_their_own_keys_and_not_counted_in_the_node_window() -> None:
    samples = [reading("n1", 0, 100.0, 40.0), reading("n1", 0, 100.0, None, mig=3)]
    (chunk,) = core.summarise(samples, 60.0)
    assert set(chunk.gpus) == {"GPU-n1-0", "GPU-n1-0/mig-3"}
    assert core.node_aggregate(chunk).samples == 1


def test_window_aggregates_merge_as_sums() -> None:
    a = core.WindowAggregate(2, 2, 30.0, 20.0, 10.0, 1.5, 10.0)
    b = core.WindowAggregate(1, 1, 90.0, 90.0, 5.0, 4.5, 0.0)
    merged = core.WindowAggregate.from_json(core.merge_json(a.to_json(), b.to_json()))
    assert merged == core.WindowAggregate(3, 3, 120.0, 90.0, 15.0, 6.0, 10.0)
    assert merged.mean_util_pct == 40.0
    assert core.merge_json({}, b.to_json()) == b.to_json()


# -- allocations --------------------------------------------------------------------------------------


def transition(state: int, generation: int = 1, *assignments: Assignment) -> Transition:
    return Transition("job-1", generation, state, "q", assignments)


def test_bound_then_moved_then_completed_releases_every_node_it_held() -> None:
    placement, changes = core.allocation_changes(
        None, transition(core.STATE_BOUND, 1, Assignment("n1", (0, 1)), Assignment("n2", (3,)))
    )
    assert [(c.node, c.gpu_indices, c.holding) for c in changes] == [("n1", (0, 1), True), ("n2", (3,), True)]
    placement, changes = core.allocation_changes(placement, transition(core.STATE_RUNNING, 1, Assignment("n1", (0, 1))))
    assert [(c.node, c.holding) for c in changes] == [("n1", True), ("n2", False)]
    placement, changes = core.allocation_changes(placement, transition(core.STATE_COMPLETED, 1))
    assert [(c.node, c.holding) for c in changes] == [("n1", False)]
    assert placement is not None and placement.ended


def test_an_older_generation_or_a_late_running_after_completion_changes_nothing() -> None:
    placement, _ = core.allocation_changes(None, transition(core.STATE_RUNNING, 2, Assignment("n1", (0,))))
    kept, changes = core.allocation_changes(placement, transition(core.STATE_FAILED, 1))
    assert (kept, changes) == (placement, [])
    ended, _ = core.allocation_changes(placement, transition(core.STATE_PREEMPTED, 2))
    again, changes = core.allocation_changes(ended, transition(core.STATE_RUNNING, 2, Assignment("n1", (0,))))
    assert (again, changes) == (ended, [])
    record = hold(None, "n1", "job-1", (0,), generation=3)
    assert core.apply_allocation(record, core.AllocationChange("n1", "job-1", 2, "q", (), False)) == record


# -- idle detection -----------------------------------------------------------------------------------


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


# -- node state -----------------------------------------------------------------------------------------


def test_node_view_has_inventory_health_holders_and_free_gpus() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 4)), "n1", "job", (1,))
    record, _, _ = feed(
        record,
        [
            reading("n1", 0, 1000.0, 10.0),
            reading("n1", 1, 1000.0, 80.0),
            reading("n1", 2, 1000.0, 0.0, ecc=2),
            reading("n1", 3, 1000.0, 0.0, xids=(79,)),
        ],
    )
    view = core.node_view(record)
    assert view.healthy
    assert [(g.index, g.healthy, g.allocated_to) for g in view.gpus] == [
        (0, True, ""),
        (1, True, "job"),
        (2, False, ""),
        (3, False, ""),
    ]
    assert view.free_gpus == (0,)
    assert view.labels[core.FREE_GPUS_LABEL] == "0"
    assert [g.nvlink_island for g in view.gpus] == [0, 0, 0, 0]
    assert core.allocated_vs_used(view) == (1, pytest.approx(0.8))


def test_a_silent_node_turns_stale_and_recovers_with_its_next_sample() -> None:
    record, _, _ = feed(core.apply_inventory(None, inventory("n1", 1)), [reading("n1", 0, 1000.0, 10.0)])
    assert core.check_stale(record, 1030.0, 30.0) is record
    stale = core.check_stale(record, 1030.5, 30.0)
    assert stale.stale and not core.node_view(stale).healthy
    back, _, _ = feed(stale, [reading("n1", 0, 1031.0, 10.0)])
    assert core.node_view(back).healthy


def test_placement_relevant_changes_publish_at_once_utilisation_only_after_the_interval() -> None:
    record, _, _ = feed(core.apply_inventory(None, inventory("n1", 2)), [reading("n1", 0, 1000.0, 10.0)])
    published = core.publish_decision(record, core.node_view(record), 1000.0, 10.0)
    assert published is not None and published.version == 1
    busier, _, _ = feed(published, [reading("n1", 0, 1001.0, 90.0)])
    assert core.publish_decision(busier, core.node_view(busier), 1001.0, 10.0) is None
    assert core.publish_decision(busier, core.node_view(busier), 1010.0, 10.0) is not None
    held = hold(busier, "n1", "job", (1,))
    again = core.publish_decision(held, core.node_view(held), 1001.0, 10.0)
    assert again is not None and again.version == 2


def test_a_node_record_survives_its_json_round_trip() -> None:
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    for t in range(0, 80, 10):
        record, _, _ = feed(record, [reading("n1", 0, 1000.0 + t, 1.0), reading("n1", 1, 1000.0 + t, 1.0)])
    assert any(h.reported_since is not None for h in record.holdings.values())
    assert NodeRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_faust_codecs_write_the_same_node_record_json_with_orjson_or_json() -> None:
    from faust.utils import json as faust_json

    orjson = pytest.importorskip("orjson")
    record = hold(core.apply_inventory(None, inventory("n1", 2)), "n1", "job", (0, 1))
    record, _, _ = feed(record, [reading("n1", 0, 1000.0, 1.0), reading("n1", 1, 1000.0, 1.0)])
    native = orjson.loads(orjson.dumps(record, default=faust_json.on_default))  # faust's orjson path
    standard = json.loads(json.dumps(record, default=lambda value: value.__json__()))  # its json path
    assert native == standard == json.loads(json.dumps(record.to_json()))
    assert NodeRecord.from_json(native) == record


def test_a_node_record_written_before_the_compact_form_is_still_restored() -> None:
    record, _, _ = feed(core.apply_inventory(None, inventory("n1", 1)), [reading("n1", 0, 1000.0, 42.0)])
    data = json.loads(json.dumps(record.to_json()))
    ((uuid, gpu),) = data["gpus"].items()
    names = [
        "index",
        "model",
        "last_ts",
        "utilization_pct",
        "memory_total_mib",
        "healthy",
        "idle_since",
        "idle_util_sum",
        "idle_util_n",
    ]
    data["gpus"][uuid] = dict(zip(names, gpu, strict=True))  # the object form of the previous changelog
    assert NodeRecord.from_json(data) == record


def test_node_windows_merge_chunks_and_windows_stored_as_objects() -> None:
    (first,) = core.summarise([reading("n1", 0, 100.0, 20.0), reading("n1", 1, 100.0, 60.0)], 60.0)
    (second,) = core.summarise([reading("n1", 0, 110.0, 40.0)], 60.0)
    merged = core.merge_node_window(core.merge_node_window(None, core.node_window(first)), core.node_window(second))
    node = core.WindowAggregate.from_json(merged["node"])
    assert (node.samples, node.mean_util_pct, node.util_max) == (3, 40.0, 60.0)
    assert core.WindowAggregate.from_json(merged["gpus"]["GPU-n1-0"]).mean_util_pct == 30.0
    old_form = {
        "node": core.WindowAggregate(1, 1, 10.0, 10.0).to_json(),
        "gpus": {"GPU-n1-0": core.WindowAggregate(1, 1, 10.0, 10.0).to_json()},
    }
    again = core.merge_node_window(old_form, core.node_window(second))
    assert core.WindowAggregate.from_json(again["gpus"]["GPU-n1-0"]).mean_util_pct == 25.0


def test_the_view_is_rebuilt_only_when_placement_could_change_or_the_interval_ran_out() -> None:
    record, _, _ = feed(
        core.apply_inventory(None, inventory("n1", 2)), [reading("n1", 0, 1000.0, 10.0), reading("n1", 1, 1000.0, 10.0)]
    )
    published = core.publish_decision(record, core.node_view(record), 1000.0, 10.0)
    assert published is not None
    busier, _, _ = feed(published, [reading("n1", 0, 1001.0, 90.0), reading("n1", 1, 1001.0, 90.0)])
    assert not core.may_need_publication(published, busier, 1001.0, 10.0)
    assert core.may_need_publication(published, busier, 1010.0, 10.0)
    broken, _, _ = feed(published, [reading("n1", 0, 1001.0, 90.0, xids=(79,))])
    assert core.may_need_publication(published, broken, 1001.0, 10.0)
    assert core.may_need_publication(published, hold(busier, "n1", "job", (0,)), 1001.0, 10.0)
    assert core.may_need_publication(published, core.check_stale(busier, 1100.0, 30.0), 1001.0, 10.0)
    assert core.may_need_publication(None, busier, 1001.0, 10.0)
    # Whenever it is False, building the view would not have published either.
    assert core.publish_decision(busier, core.node_view(busier), 1001.0, 10.0) is None


# -- known nodes ----------------------------------------------------------------------------------------


def test_a_node_is_known_from_any_registration_until_every_source_drops_it() -> None:
    registry = core.NodeRegistry()
    assert "n1" not in registry
    registry.record("node.inventory", "n1", True)
    registry.record("cluster.state", "n1", True)
    registry.record("cluster.state", "n2", True)
    assert "n1" in registry and "n2" in registry and len(registry) == 2
    registry.record("node.inventory", "n1", False)  # a tombstone on one topic
    assert "n1" in registry
    registry.record("cluster.state", "n1", False)
    assert "n1" not in registry and len(registry) == 1
    registry.record("node.inventory", "n3", False)  # a tombstone for a node never seen changes nothing
    assert "n3" not in registry and len(registry) == 1


def test_the_unknown_node_reason_names_the_field_the_node_and_where_it_was_looked_for() -> None:
    reason = core.unknown_node_reason("gpu-node-9", ["p.node.inventory", "p.cluster.state"])
    assert reason == "unknown node: node: 'gpu-node-9' has no record on p.node.inventory or p.cluster.state"


# -- configuration --------------------------------------------------------------------------------------


def test_config_from_env_and_errors_name_the_variable() -> None:
    config = TelemetryConfig.from_env(
        {"KUMIKI_TELEMETRY_IDLE": "default=3:120, research=10:1800", "KUMIKI_TELEMETRY_USAGE_WINDOW_S": "600"}
    )
    assert config.idle_default == IdleRule(3.0, 120.0)
    assert config.rule_for("research") == IdleRule(10.0, 1800.0)
    assert config.rule_for("other") == IdleRule(3.0, 120.0)
    assert config.bucket_s == 60.0
    for env, name in [
        ({"KUMIKI_TELEMETRY_IDLE": "research=abc:5"}, "KUMIKI_TELEMETRY_IDLE"),
        ({"KUMIKI_TELEMETRY_IDLE": "research=150:5"}, "KUMIKI_TELEMETRY_IDLE"),
        ({"KUMIKI_TELEMETRY_IDLE": "research"}, "KUMIKI_TELEMETRY_IDLE"),
        ({"KUMIKI_TELEMETRY_USAGE_STEP_S": "900"}, "KUMIKI_TELEMETRY_USAGE_STEP_S"),
        ({"KUMIKI_TELEMETRY_GPU_WINDOW_S": "1.5"}, "KUMIKI_TELEMETRY_GPU_WINDOW_S"),
        ({"KUMIKI_TELEMETRY_NODE_TIMEOUT_S": "-1"}, "KUMIKI_TELEMETRY_NODE_TIMEOUT_S"),
        ({"KUMIKI_TELEMETRY_BATCH_WINDOW_S": "0"}, "KUMIKI_TELEMETRY_BATCH_WINDOW_S"),
        ({"KUMIKI_TELEMETRY_BATCH_MAX": "many"}, "KUMIKI_TELEMETRY_BATCH_MAX"),
    ]:
        with pytest.raises(ConfigError, match=f"^{name}: "):
            TelemetryConfig.from_env(env)


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
