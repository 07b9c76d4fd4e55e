"""The agent's pure core: validation, tick schedule, conversions, JSON round trips."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.agent.core import (
    GpuDevice,
    GpuInventory,
    GpuPair,
    GpuSample,
    MigInstance,
    RecordError,
    SampleFields,
    SampleRejected,
    TickSchedule,
    cuda_version_string,
    group_by_timestamp,
    inventory_from_dict,
    inventory_to_dict,
    mig_profile,
    node_name_error,
    normalise_pci_bus_id,
    nvlink_counts,
    partition_samples,
    sample_from_dict,
    sample_to_dict,
    topology_name,
    validate_sample,
)

GIB = 1024**3


def sample(**changes: object) -> GpuSample:
    fields = SampleFields(
        gpu_util_pct=55.0,
        memory_util_pct=20.0,
        memory_used_bytes=10 * GIB,
        memory_total_bytes=80 * GIB,
        power_w=250.0,
        temperature_c=60.0,
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=0,
    )
    field_changes = {k: v for k, v in changes.items() if hasattr(fields, k)}
    other = {k: v for k, v in changes.items() if not hasattr(fields, k)}
    base = GpuSample(
        node="node-a",
        gpu_uuid="GPU-1",
        gpu_index=0,
        mig_instance_id=None,
        timestamp=1_700_000_000.0,
        fields=replace(fields, **field_changes),
    )
    return replace(base, **other)


# -- validation -----------------------------------------------------------------------------------


def test_a_plausible_sample_is_accepted_unchanged() -> None:
    good = sample()
    assert validate_sample(good, known_nodes={"node-a"}) is good


@pytest.mark.parametrize(
    ("changes", "field_name"),
    [
        ({"memory_used_bytes": -1}, "memory_used_bytes"),
        ({"memory_total_bytes": -5}, "memory_total_bytes"),
        ({"memory_used_bytes": 81 * GIB}, "memory_used_bytes"),
        ({"gpu_util_pct": 100.5}, "gpu_util_pct"),
        ({"gpu_util_pct": -0.1}, "gpu_util_pct"),
        ({"memory_util_pct": math.nan}, "memory_util_pct"),
        ({"power_w": -3.0}, "power_w"),
        ({"power_w": math.inf}, "power_w"),
        ({"temperature_c": 400.0}, "temperature_c"),
        ({"ecc_uncorrected_volatile": -2}, "ecc_uncorrected_volatile"),
        ({"engine_active_ratio": 1.5}, "engine_active_ratio"),
        ({"xid_errors": (79, 0)}, "xid_errors"),
        ({"node": ""}, "node"),
        ({"gpu_uuid": ""}, "gpu_uuid"),
        ({"gpu_index": -1}, "gpu_index"),
        ({"mig_instance_id": -4}, "mig_instance_id"),
        ({"timestamp": 0.0}, "timestamp"),
        ({"timestamp": math.nan}, "timestamp"),
    ],
)
def test_impossible_values_are_rejected_naming_the_field(changes: dict[str, object], field_name: str) -> None:
    bad = sample(**changes)
    with pytest.raises(SampleRejected) as raised:
        validate_sample(bad)
    assert raised.value.field_name == field_name
    assert raised.value.sample is bad
    assert str(raised.value).startswith(f"{field_name}: ")


def test_boundaries_are_possible() -> None:
    edge = sample(gpu_util_pct=100.0, memory_util_pct=0.0, memory_used_bytes=80 * GIB, power_w=0.0)
    assert validate_sample(edge) is edge


def test_unknown_node_is_rejected_only_when_nodes_are_known() -> None:
    stranger = sample(node="node-z")
    assert validate_sample(stranger) is stranger
    with pytest.raises(SampleRejected, match="unknown node 'node-z'") as raised:
        validate_sample(stranger, known_nodes={"node-a", "node-b"})
    assert raised.value.field_name == "node"


def test_unset_fields_are_not_judged() -> None:
    empty = sample(gpu_util_pct=None, memory_used_bytes=None, memory_total_bytes=None, power_w=None)
    assert validate_sample(empty) is empty


def test_partition_keeps_order_and_reasons() -> None:
    batch = [
        sample(gpu_index=0),
        sample(gpu_index=1, gpu_util_pct=130.0),
        sample(gpu_index=2),
        sample(gpu_index=3, node="ghost"),
    ]
    accepted, rejected = partition_samples(batch, known_nodes={"node-a"})
    assert [s.gpu_index for s in accepted] == [0, 2]
    assert [(r.sample.gpu_index, r.field_name) for r in rejected] == [(1, "gpu_util_pct"), (3, "node")]


@pytest.mark.parametrize("node", ["gpu-node-1", "ip-10-0-0-1.ec2.internal", "a"])
def test_kubernetes_node_names_are_accepted(node: str) -> None:
    assert node_name_error(node) is None


@pytest.mark.parametrize("node", ["", "Node_A", "-edge", "edge-", "a" * 254, "has space"])
def test_bad_node_names_are_explained(node: str) -> None:
    assert node_name_error(node)


# -- tick schedule --------------------------------------------------------------------------------


def test_ticks_on_time_follow_the_grid() -> None:
    schedule = TickSchedule(interval_s=0.5, origin=100.0)
    assert schedule.next_tick(100.0, now=100.1) == (100.5, 0)
    assert schedule.next_tick(100.5, now=100.5) == (101.0, 0)


def test_missed_ticks_are_skipped_not_bursted_and_stay_on_the_grid() -> None:
    schedule = TickSchedule(interval_s=1.0, origin=10.0)
    # The tick at 10 took until 13.4: ticks 11, 12 and 13 are gone; the next is 14.
    assert schedule.next_tick(10.0, now=13.4) == (14.0, 3)
    # Just past a tick counts that tick as missed.
    assert schedule.next_tick(10.0, now=11.000001) == (12.0, 1)


def test_duration_bounds_the_ticks() -> None:
    schedule = TickSchedule(interval_s=1.0, origin=0.0, duration_s=3.0)
    due = [tick for tick in (0.0, 1.0, 2.0, 3.0, 4.0) if schedule.is_due(tick)]
    assert due == [0.0, 1.0, 2.0]
    assert TickSchedule(interval_s=1.0, origin=0.0).is_due(1e9)


@pytest.mark.parametrize(
    ("interval", "duration", "field_name"),
    [
        (0.0, None, "interval_s"),
        (-1.0, None, "interval_s"),
        (math.nan, None, "interval_s"),
        (5000.0, None, "interval_s"),
        (1.0, 0.0, "duration_s"),
        (1.0, -2.0, "duration_s"),
    ],
)
def test_bad_schedules_are_refused(interval: float, duration: float | None, field_name: str) -> None:
    with pytest.raises(ValueError, match=f"^{field_name}: "):
        TickSchedule(interval_s=interval, origin=0.0, duration_s=duration)


# -- conversions ----------------------------------------------------------------------------------


def test_cuda_and_topology_names() -> None:
    assert cuda_version_string(12040) == "12.4"
    assert cuda_version_string(11080) == "11.8"
    assert topology_name(10) == "SINGLE"
    assert topology_name(50) == "SYSTEM"
    assert topology_name(35) == "LEVEL_35"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000000:07:00.0", "00000000:07:00.0"),
        ("0000:07:00.0", "00000000:07:00.0"),
        ("00000000:4F:00.0", "00000000:4f:00.0"),
        ("4f:00.0", "00000000:4f:00.0"),
        ("garbage", None),
    ],
)
def test_pci_bus_ids_have_one_spelling(text: str, expected: str | None) -> None:
    assert normalise_pci_bus_id(text) == expected


def test_mig_profile_from_name_or_attributes() -> None:
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 1, 4864) == "1g.5gb"
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", None, None) == "1g.10gb+me"
    assert mig_profile("NVIDIA A100-SXM4-40GB MIG", 3, 19968) == "3g.20gb"
    assert mig_profile(None, None, None) is None


def test_nvlink_counts_match_remote_addresses_to_gpus() -> None:
    bus = {0: "00000000:07:00.0", 1: "00000000:0F:00.0", 2: "00000000:47:00.0", 3: None}
    remotes = {
        0: ["0000:0f:00.0"] * 4 + ["00000000:C0:00.0"],  # four to GPU 1, one to an NVSwitch
        1: ["00000000:07:00.0"] * 4,
        2: ["00000000:07:00.0"] * 2,  # only GPU 2 sees these links up
        3: [],
    }
    assert nvlink_counts(bus, remotes) == {(0, 1): 4, (0, 2): 2}


# -- JSON round trips -----------------------------------------------------------------------------


def test_sample_round_trips_through_json_dicts() -> None:
    original = sample(
        xid_errors=(79, 48), mig_instance_id=3, labels={"pod": "p", "namespace": "n"}, model="NVIDIA L4", source="nvml"
    )
    encoded = sample_to_dict(original)
    assert "last_xid" not in encoded["fields"]  # unset stays unset, not 0 or null
    assert sample_from_dict(encoded) == original


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("gpu_uuid"), "gpu_uuid: missing"),
        (lambda d: d.update(gpu_index="0"), "gpu_index: expected int"),
        (lambda d: d.update(gpu_index=True), "gpu_index: expected int, got bool"),
        (lambda d: d["fields"].update(power_w="hot"), r"fields\.power_w: expected"),
        (lambda d: d["fields"].update(watts=1), "fields.watts: unknown field"),
        (lambda d: d["fields"].update(xid_errors=[79, "x"]), r"fields.xid_errors\[1\]"),
        (lambda d: d.update(kind="inventory"), "kind: expected 'sample'"),
        (lambda d: d.update(labels={"pod": 3}), "labels.pod: expected str"),
        (lambda d: d.update(source=1), "source: expected str"),
    ],
)
def test_bad_recorded_samples_name_the_field(mutate, message: str) -> None:
    encoded = sample_to_dict(sample())
    mutate(encoded)
    with pytest.raises(RecordError, match=message):
        sample_from_dict(encoded, "f:1: ")


def inventory() -> GpuInventory:
    return GpuInventory(
        node="node-a",
        collected_at=1_700_000_000.0,
        driver_version="550.54.15",
        cuda_driver_version="12.4",
        gpus=(
            GpuDevice(0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, "00000000:07:00.0", False, (), 18),
            GpuDevice(
                1,
                "GPU-1",
                "NVIDIA H100 80GB HBM3",
                80 * GIB,
                "00000000:0F:00.0",
                True,
                (MigInstance(1, 0, "MIG-1", "3g.40gb", 40 * GIB, 4, 4), MigInstance(2, None, None, None, None)),
                18,
            ),
            GpuDevice(2, "GPU-2", None, None, None, None, (), None),
        ),
        pairs=(GpuPair(0, 1, "SINGLE", 18, True), GpuPair(0, 2, None, 0, None), GpuPair(1, 2, "SYSTEM", 0, False)),
    )


def test_inventory_round_trips_and_knows_nvlink_peers() -> None:
    original = inventory()
    assert inventory_from_dict(inventory_to_dict(original)) == original
    assert original.nvlink_peers(0) == (1,)
    assert original.nvlink_peers(1) == (0,)
    assert original.nvlink_peers(2) == ()


def test_bad_inventory_names_the_field() -> None:
    encoded = inventory_to_dict(inventory())
    encoded["gpus"][1]["mig_instances"][0]["gpu_instance_id"] = "one"
    with pytest.raises(RecordError, match=r"gpus\[1\]\.mig_instances\[0\]\.gpu_instance_id"):
        inventory_from_dict(encoded)
    encoded = inventory_to_dict(inventory())
    encoded["format"] = "something/v9"
    with pytest.raises(RecordError, match="format"):
        inventory_from_dict(encoded)


def test_batches_are_runs_of_one_timestamp() -> None:
    stamps = [(1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1), (3.0, 0)]
    samples = [sample(timestamp=t, gpu_index=i) for t, i in stamps]
    batches = group_by_timestamp(samples)
    assert [[s.gpu_index for s in batch] for batch in batches] == [[0, 1], [0, 1], [0]]


@settings(max_examples=300, deadline=None)
@given(
    interval=st.floats(min_value=0.01, max_value=60),
    start_tick=st.integers(min_value=0, max_value=10_000),
    late_by=st.floats(min_value=0, max_value=1000),
)
def test_next_tick_is_on_the_grid_in_the_future_and_counts_what_it_skipped(
    interval: float, start_tick: int, late_by: float
) -> None:
    schedule = TickSchedule(interval_s=interval, origin=50.0)
    previous = 50.0 + start_tick * interval
    now = previous + late_by
    tick, skipped = schedule.next_tick(previous, now)
    assert tick >= now - 1e-9
    assert tick - now < interval + 1e-6  # never a tick further than necessary
    steps = (tick - previous) / interval
    assert abs(steps - round(steps)) < 1e-6  # on the grid
    assert skipped == round(steps) - 1


def test_inventory_changes_name_what_changed_and_ignore_the_time() -> None:
    from dataclasses import replace

    from kumiki.agent.core import GpuDevice, GpuInventory, MigInstance, inventory_changes

    mig = MigInstance(1, 0, "MIG-a", "3g.40gb", 40 << 30, 4, 3)
    gpus = (
        GpuDevice(0, "GPU-0", "A100", 80 << 30, "00:07", True, (mig,), 12),
        GpuDevice(1, "GPU-1", "A100", 80 << 30, "00:0F", False, (), 12),
    )
    before = GpuInventory("n1", 100.0, "550", "12040", gpus)
    assert inventory_changes(before, replace(before, collected_at=160.0)) == []
    two = (mig, MigInstance(9, 0, "MIG-b", "1g.10gb", 10 << 30, 0, 1))
    after = replace(
        before,
        collected_at=160.0,
        gpus=(replace(gpus[0], mig_instances=two), replace(gpus[1], mig_enabled=True, nvlinks_active=11)),
    )
    assert inventory_changes(before, after) == [
        "GPU 0: MIG instances 1 -> 2 (3g.40gb, 1g.10gb)",
        "GPU 1: MIG on",
        "GPU 1: active NVLinks 12 -> 11",
    ]
    assert inventory_changes(before, replace(before, gpus=gpus[:1])) == ["GPU 1 (GPU-1) gone"]
    assert inventory_changes(before, replace(before, driver_version="560")) == ["driver, topology or device details"]
