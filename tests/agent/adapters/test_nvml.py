"""NvmlSource against the fake libnvidia-ml.so.1: the real pynvml calls, configured answers."""

from __future__ import annotations

import logging

import pytest

from kumiki.agent.adapters.nvml import NvmlSource, NvmlUnavailable
from kumiki.agent.app import RunStats, ThreadedNvmlSource, run_sampling
from kumiki.agent.core import GpuPair, MigInstance, TickSchedule, validate_sample

from ..conftest import FakeNvml
from ..fake_nvml.build import FakeNvmlConfig
from ..test_app import FakeClock, ListSink

GIB = 1024**3
NODE = "gpu-node-1"


def hgx_node() -> FakeNvmlConfig:
    """Four A100s: 0-1 and 2-3 NVLinked, GPU 2 in MIG mode, GPU 3 without power readings."""

    def gpu(n: int, **extra: object) -> dict[str, object]:
        return {
            "uuid": f"GPU-0000000{n}-aaaa-bbbb-cccc-00000000000{n}",
            "name": "NVIDIA A100-SXM4-80GB",
            "bus_id": f"00000000:{0x07 + 8 * n:02X}:00.0",
            "memory_total": 80 * GIB,
            "memory_used": (n + 1) * GIB,
            "util_gpu": [10 * (n + 1), 50, 100],
            "util_memory": [n, 7],
            "power_mw": 100_000 + 1_500 * n,
            "temperature_c": 40 + n,
            "ecc_corrected": n,
            "ecc_uncorrected": 0,
            "mig": "off",
            "nvlink_count": 12,
            **extra,
        }

    return FakeNvmlConfig(
        system={"driver_version": "550.54.15", "cuda_version": 12040, "topology_default": "SYSTEM"},
        gpus=[gpu(0), gpu(1), gpu(2, mig="on"), gpu(3, unsupported="power")],
        migs=[
            {
                "gpu": 2,
                "gpu_instance": 1,
                "compute_instance": 0,
                "uuid": "MIG-11111111-2222-3333-4444-555555555555",
                "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                "memory_total": 40 * GIB,
                "memory_used": 3 * GIB,
                "slices": 3,
                "placement_start": 4,
            },
            # No profile in the name: the agent derives it from the instance's attributes.
            {
                "gpu": 2,
                "gpu_instance": 9,
                "compute_instance": 0,
                "uuid": "MIG-66666666-7777-8888-9999-000000000000",
                "name": "NVIDIA A100-SXM4-80GB MIG",
                "memory_total": 9728 * 1024 * 1024,
                "memory_used": 0,
                "slices": 1,
                "placement_start": 0,
            },
        ],
        nvlinks=[{"a": 0, "b": 1, "links": 12}, {"a": 2, "b": 3, "links": 4}],
        topology=[
            {"a": 0, "b": 1, "level": "SINGLE"},
            {"a": 2, "b": 3, "level": "HOSTBRIDGE"},
            {"a": 0, "b": 2, "level": "NODE"},
        ],
    )


def open_source(fake_nvml: FakeNvml, config: FakeNvmlConfig) -> tuple[NvmlSource, object]:
    fake_nvml.configure(config)
    source = NvmlSource(NODE)
    inventory = source.open(now=1_700_000_000.0)
    return source, inventory


def test_inventory_reports_configured_gpus_mig_and_topology(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    source, inventory = open_source(fake_nvml, config)
    try:
        assert inventory.node == NODE
        assert inventory.driver_version == "550.54.15"
        assert inventory.cuda_driver_version == "12.4"
        assert [gpu.index for gpu in inventory.gpus] == [0, 1, 2, 3]
        for gpu, configured in zip(inventory.gpus, config.gpus, strict=True):
            assert gpu.uuid == configured["uuid"]
            assert gpu.name == configured["name"]
            assert gpu.memory_total_bytes == configured["memory_total"]
            assert gpu.pci_bus_id == configured["bus_id"]
        assert [gpu.mig_enabled for gpu in inventory.gpus] == [False, False, True, False]
        assert inventory.gpus[2].mig_instances == (
            MigInstance(1, 0, "MIG-11111111-2222-3333-4444-555555555555", "3g.40gb", 40 * GIB, 4, 3),
            MigInstance(9, 0, "MIG-66666666-7777-8888-9999-000000000000", "1g.10gb", 9728 * 1024 * 1024, 0, 1),
        )
        assert [gpu.nvlinks_active for gpu in inventory.gpus] == [12, 12, 4, 4]
        pairs = {(pair.a, pair.b): pair for pair in inventory.pairs}
        assert len(pairs) == 6
        assert pairs[(0, 1)] == GpuPair(0, 1, "SINGLE", 12, True)
        assert pairs[(2, 3)] == GpuPair(2, 3, "HOSTBRIDGE", 4, True)
        assert pairs[(0, 2)] == GpuPair(0, 2, "NODE", 0, False)
        assert pairs[(1, 3)] == GpuPair(1, 3, "SYSTEM", 0, False)
        assert inventory.nvlink_peers(0) == (1,)
        assert inventory.nvlink_peers(3) == (2,)
    finally:
        source.close()


def test_samples_follow_the_configured_values_tick_by_tick(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    source, _ = open_source(fake_nvml, config)
    try:
        ticks = [source.sample(timestamp=1_700_000_001.0 + tick) for tick in range(4)]
    finally:
        source.close()
    for tick, samples in enumerate(ticks):
        # One sample per GPU, plus one per MIG instance right after its GPU.
        assert [(s.gpu_index, s.mig_instance_id) for s in samples] == [
            (0, None),
            (1, None),
            (2, None),
            (2, 1),
            (2, 9),
            (3, None),
        ]
        assert {s.timestamp for s in samples} == {1_700_000_001.0 + tick}
        whole = {s.gpu_index: s for s in samples if s.mig_instance_id is None}
        for index in (0, 1, 3):
            configured = config.gpus[index]
            values = whole[index].fields
            assert whole[index].gpu_uuid == configured["uuid"]
            assert whole[index].node == NODE
            assert whole[index].model == configured["name"]
            assert whole[index].source == "nvml"
            util_gpu, util_memory = configured["util_gpu"], configured["util_memory"]
            assert values.gpu_util_pct == util_gpu[tick % len(util_gpu)]
            assert values.memory_util_pct == util_memory[tick % len(util_memory)]
            assert values.memory_used_bytes == configured["memory_used"]
            assert values.memory_total_bytes == configured["memory_total"]
            assert values.temperature_c == configured["temperature_c"]
            assert values.ecc_corrected_volatile == configured["ecc_corrected"]
            assert values.ecc_uncorrected_volatile == 0
        assert whole[0].fields.power_w == 100.0
        assert whole[1].fields.power_w == 101.5
        for sample in samples:
            validate_sample(sample, known_nodes={NODE})


def test_not_supported_leaves_the_field_unset_without_counting_an_error(fake_nvml: FakeNvml) -> None:
    source, _ = open_source(fake_nvml, hgx_node())
    try:
        samples = source.sample(timestamp=1_700_000_001.0)
    finally:
        source.close()
    gpu3 = next(s for s in samples if s.gpu_index == 3)
    assert gpu3.fields.power_w is None
    assert gpu3.fields.temperature_c == 43.0
    assert (3, "power") in source.unsupported
    assert "power" not in source.errors


def test_mig_instances_are_sampled_with_their_own_memory(fake_nvml: FakeNvml) -> None:
    source, _ = open_source(fake_nvml, hgx_node())
    try:
        samples = source.sample(timestamp=1_700_000_001.0)
    finally:
        source.close()
    parent = next(s for s in samples if s.gpu_index == 2 and s.mig_instance_id is None)
    instance = next(s for s in samples if s.mig_instance_id == 1)
    # With MIG on, NVML has no whole-GPU utilisation; the board still has power and temperature.
    assert parent.fields.gpu_util_pct is None
    assert parent.fields.power_w == 103.0
    assert instance.gpu_uuid == parent.gpu_uuid
    assert instance.model == parent.model == "NVIDIA A100-SXM4-80GB"
    assert instance.fields.memory_used_bytes == 3 * GIB
    assert instance.fields.memory_total_bytes == 40 * GIB
    assert instance.fields.gpu_util_pct is None
    assert instance.fields.power_w is None
    assert (2, "utilization") in source.unsupported


def test_other_nvml_errors_are_counted_logged_once_and_never_raised(
    fake_nvml: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    config = hgx_node()
    config.gpus[1] = {**config.gpus[1], "errors": "temperature:15"}  # NVML_ERROR_GPU_IS_LOST
    source, _ = open_source(fake_nvml, config)
    caplog.set_level(logging.WARNING, logger="kumiki.agent.adapters.nvml")
    try:
        ticks = [source.sample(timestamp=1_700_000_001.0 + tick) for tick in range(3)]
    finally:
        source.close()
    for samples in ticks:
        by_index = {s.gpu_index: s for s in samples if s.mig_instance_id is None}
        assert by_index[1].fields.temperature_c is None
        assert by_index[1].fields.power_w == 101.5
        assert by_index[0].fields.temperature_c == 40.0
    assert source.errors["temperature"] == 3
    assert (1, "temperature") not in source.unsupported
    warnings = [r for r in caplog.records if "temperature" in r.getMessage()]
    assert len(warnings) == 1
    assert "GPU is lost" in warnings[0].getMessage()


def test_xid_events_arrive_once_on_the_tick_after_they_happen(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    config.xids = [
        {"gpu": 1, "code": 79, "drain": 1},
        {"gpu": 1, "code": 48, "drain": 1},
        {"gpu": 2, "code": 31, "gpu_instance": 9, "drain": 0},
        {"gpu": 2, "code": 94, "gpu_instance": 5, "drain": 0},  # an instance the agent does not know
    ]
    source, _ = open_source(fake_nvml, config)
    try:
        ticks = [source.sample(timestamp=1_700_000_001.0 + tick) for tick in range(3)]
    finally:
        source.close()

    def xids(samples: list, index: int, instance: int | None) -> tuple[int, ...]:
        match = next(s for s in samples if (s.gpu_index, s.mig_instance_id) == (index, instance))
        return match.fields.xid_errors

    assert xids(ticks[0], 1, None) == ()
    assert xids(ticks[1], 1, None) == (79, 48)
    assert xids(ticks[2], 1, None) == ()
    assert xids(ticks[0], 2, 9) == (31,)
    assert xids(ticks[0], 2, None) == (94,)
    assert xids(ticks[1], 2, 9) == ()


def test_events_not_supported_on_a_gpu_keeps_sampling(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    config.gpus[0] = {**config.gpus[0], "unsupported": "events"}
    config.xids = [{"gpu": 0, "code": 13}]
    source, _ = open_source(fake_nvml, config)
    try:
        samples = source.sample(timestamp=1_700_000_001.0)
    finally:
        source.close()
    assert (0, "events") in source.unsupported
    assert samples[0].fields.xid_errors == ()
    assert samples[0].fields.gpu_util_pct == 10.0
    assert not source.errors


def test_gpus_without_nvlink_or_mig_report_none_not_zero(fake_nvml: FakeNvml) -> None:
    config = FakeNvmlConfig(
        gpus=[
            {
                "uuid": "GPU-pcie-0",
                "name": "NVIDIA L4",
                "memory_total": 24 * GIB,
                "mig": "unsupported",
                "nvlink_count": 0,
            },
            {
                "uuid": "GPU-pcie-1",
                "name": "NVIDIA L4",
                "memory_total": 24 * GIB,
                "mig": "unsupported",
                "nvlink_count": 0,
            },
        ],
        topology=[{"a": 0, "b": 1, "level": "MULTIPLE"}],
    )
    source, inventory = open_source(fake_nvml, config)
    source.close()
    assert [gpu.mig_enabled for gpu in inventory.gpus] == [None, None]
    assert [gpu.nvlinks_active for gpu in inventory.gpus] == [None, None]
    assert inventory.pairs == (GpuPair(0, 1, "MULTIPLE", 0, False),)
    assert inventory.nvlink_peers(0) == ()


def test_memory_used_excludes_driver_reserved_memory_like_dcgm(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    config.gpus[0] = {**config.gpus[0], "memory_reserved": 600 * 1024 * 1024}
    source, _ = open_source(fake_nvml, config)
    try:
        gpu0 = source.sample(timestamp=1_700_000_001.0)[0]
    finally:
        source.close()
    assert gpu0.fields.memory_used_bytes == config.gpus[0]["memory_used"]
    assert gpu0.fields.memory_total_bytes == 80 * GIB


def test_drivers_without_memory_info_v2_fall_back_to_v1(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    config.gpus[0] = {
        **config.gpus[0],
        "memory_reserved": 600 * 1024 * 1024,
        "errors": "memory_v2:13",
    }  # NVML_ERROR_FUNCTION_NOT_FOUND
    source, _ = open_source(fake_nvml, config)
    try:
        samples = source.sample(timestamp=1_700_000_001.0)
    finally:
        source.close()
    # v1's "used" includes what the driver reserved; every GPU is now read through v1.
    assert samples[0].fields.memory_used_bytes == config.gpus[0]["memory_used"] + 600 * 1024 * 1024
    assert samples[1].fields.memory_used_bytes == config.gpus[1]["memory_used"]
    assert not source.errors


def test_a_gpu_without_a_readable_uuid_is_left_out(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    config.gpus[1] = {**config.gpus[1], "errors": "uuid:15"}
    source, inventory = open_source(fake_nvml, config)
    try:
        samples = source.sample(timestamp=1_700_000_001.0)
    finally:
        source.close()
    assert [gpu.index for gpu in inventory.gpus] == [0, 2, 3]
    assert 1 not in {s.gpu_index for s in samples}
    assert source.errors["gpu_skipped"] == 1


def test_nvml_that_cannot_start_raises_nvml_unavailable(fake_nvml: FakeNvml, tmp_path) -> None:
    bad = tmp_path / "bad.ini"
    bad.write_text("[gpu]\nmemory_total = lots\n", encoding="utf-8")
    fake_nvml.monkeypatch.setenv("FAKE_NVML_CONFIG", str(bad))
    with pytest.raises(NvmlUnavailable, match="NVML could not be initialised"):
        NvmlSource(NODE).open(now=1.0)


def test_mig_placement_needs_privilege_and_its_absence_only_blanks_it(fake_nvml: FakeNvml) -> None:
    config = hgx_node()
    config.gpus[2] = {**config.gpus[2], "errors": "gpu_instance:4"}  # NVML_ERROR_NO_PERMISSION
    source, inventory = open_source(fake_nvml, config)
    source.close()
    instances = inventory.gpus[2].mig_instances
    assert [(m.gpu_instance_id, m.profile, m.placement_start) for m in instances] == [
        (1, "3g.40gb", None),
        (9, "1g.10gb", None),
    ]
    assert source.errors["mig_placement"] == 2


def test_two_sources_in_one_process_share_nvml_like_the_real_library(fake_nvml: FakeNvml) -> None:
    first, _ = open_source(fake_nvml, hgx_node())
    second = NvmlSource("gpu-node-1")
    second.open(now=1.0)
    second.close()  # one shutdown of two inits: NVML stays up for the first source
    try:
        samples = first.sample(timestamp=1_700_000_001.0)
    finally:
        first.close()
    assert samples[0].fields.gpu_util_pct == 10.0
    assert not first.errors


def test_sample_before_open_is_a_programming_error(fake_nvml: FakeNvml) -> None:
    with pytest.raises(RuntimeError, match="before open"):
        NvmlSource(NODE).sample(timestamp=1.0)


async def _run_with_re_reads(
    fake_nvml: FakeNvml, before: FakeNvmlConfig, after: FakeNvmlConfig, seconds: float, every_s: float
) -> tuple[RunStats, ListSink]:
    """The agent's loop on a fake clock over the real NvmlSource: opened on `before`, the fake then reconfigured
    to `after` (what `nvidia-smi mig -dci/-dgi/-cgi` leaves behind), the inventory read again every `every_s`."""
    fake_nvml.configure(before)
    source = ThreadedNvmlSource(NODE)
    inventory = await source.open(1_700_000_000.0)
    sink, clock = ListSink(), FakeClock()
    try:
        fake_nvml.configure(after)
        stats = await run_sampling(
            source, sink, TickSchedule(1.0, clock(), seconds), clock=clock, sleep=clock.sleep,
            inventory=inventory, inventory_sink=sink, inventory_every_s=every_s,
        )  # fmt: skip
    finally:
        await source.close()
    return stats, sink


async def test_a_mig_reconfiguration_is_published_and_sampled_from_the_new_layout(fake_nvml: FakeNvml) -> None:
    """The agent reads its inventory again while it runs (NVML shut down and initialised again): GPU 2's two
    MIG instances become one 7g.80gb; the new inventory goes out once, before samples of the new instance."""
    after = hgx_node()
    after.migs = [
        {"gpu": 2, "gpu_instance": 0, "compute_instance": 0, "uuid": "MIG-77777777-0000-0000-0000-000000000000",
         "name": "NVIDIA A100-SXM4-80GB MIG 7g.80gb", "memory_total": 80 * GIB, "memory_used": GIB, "slices": 7,
         "placement_start": 0},
    ]  # fmt: skip
    stats, sink = await _run_with_re_reads(fake_nvml, hgx_node(), after, 6.0, 3.0)
    assert stats.inventory_changes == 1 and stats.inventory_errors == 0
    [changed] = sink.inventories
    assert [mig.uuid for mig in changed.gpus[2].mig_instances] == ["MIG-77777777-0000-0000-0000-000000000000"]
    assert changed.gpus[2].mig_instances[0].profile == "7g.80gb"
    instances = [{s.mig_instance_id for s in batch if s.gpu_index == 2} for batch in sink.batches]
    assert instances[:3] == [{None, 1, 9}] * 3  # ticks 0-2: the layout the agent started with
    assert instances[3:] == [{None, 0}] * 3  # from the re-read on: the new instance only


async def test_an_unchanged_inventory_is_not_published_again(fake_nvml: FakeNvml) -> None:
    stats, sink = await _run_with_re_reads(fake_nvml, hgx_node(), hgx_node(), 5.0, 1.0)
    assert (stats.inventory_changes, stats.inventory_errors, sink.inventories) == (0, 0, [])
    assert stats.ticks == 5 and stats.tick_errors == 0
