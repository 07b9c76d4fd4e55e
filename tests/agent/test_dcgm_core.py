"""Reading dcgm-exporter pages: the text-format parser and the mapping onto GpuSample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.agent.core import validate_sample
from kumiki.agent.dcgm_core import parse_exposition, read_exporter_page

PAGE = (Path(__file__).parent / "fixtures" / "dcgm_exporter_a100_mig.prom").read_text(encoding="utf-8")
MIB = 1024 * 1024
UUID0 = "GPU-5fd4ab0c-7e3b-1c2a-9d11-0a1b2c3d4e50"
UUID1 = "GPU-5fd4ab0c-7e3b-1c2a-9d11-0a1b2c3d4e51"
UUID2 = "GPU-5fd4ab0c-7e3b-1c2a-9d11-0a1b2c3d4e52"


def test_parser_reads_labels_escapes_special_values_and_timestamps() -> None:
    text = "\n".join(
        [
            "# HELP x a metric",
            "# TYPE x gauge",
            'x{a="1",b="say \\"hi\\"",c="back\\\\slash",d="line\\nbreak",} 2.5',
            "bare_metric 7",
            'nan_metric{gpu="0"} NaN',
            'inf_metric{gpu="0"} +Inf',
            'stamped{gpu="0"} 3 1700000000123',
            "",
        ]
    )
    page = parse_exposition(text)
    assert page.errors == ()
    first, bare, nan, inf, stamped = page.metrics
    assert first.name == "x"
    assert first.labels == {"a": "1", "b": 'say "hi"', "c": "back\\slash", "d": "line\nbreak"}
    assert first.value == 2.5
    assert (bare.name, bare.labels, bare.value) == ("bare_metric", {}, 7.0)
    assert math.isnan(nan.value)
    assert inf.value == math.inf
    assert stamped.timestamp_ms == 1_700_000_000_123


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('m{gpu="0" 1', "expected ',' or '}'"),
        ("m{gpu=0} 1", "no quoted value"),
        ('m{gpu="0} 1', "not closed"),
        ("m{} forty", "not a number"),
        ("m 1 2 3", "expected a value"),
        ('m{gpu="0",gpu="1"} 1', "given twice"),
        ("m 1 soon", "timestamp"),
    ],
)
def test_bad_lines_are_reported_and_the_rest_is_kept(line: str, reason: str) -> None:
    page = parse_exposition(f"good 1\n{line}\nalso_good 2\n")
    assert [m.name for m in page.metrics] == ["good", "also_good"]
    assert len(page.errors) == 1
    assert page.errors[0].startswith("line 2: ")
    assert reason in page.errors[0]


def test_exporter_page_becomes_samples_per_gpu_and_mig_instance() -> None:
    reading = read_exporter_page(PAGE, node=None, scraped_at=1_700_000_000.0)
    assert reading.errors == ()
    keys = [(s.gpu_index, s.mig_instance_id) for s in reading.samples]
    assert keys == [(0, None), (1, None), (1, 1), (1, 2), (2, None)]
    by_key = {(s.gpu_index, s.mig_instance_id): s for s in reading.samples}
    assert {s.node for s in reading.samples} == {"gpu-node-7"}
    assert {(s.model, s.source) for s in reading.samples} == {("NVIDIA A100-SXM4-80GB", "dcgm")}
    assert {s.timestamp for s in reading.samples} == {1_700_000_000.0}

    gpu0 = by_key[(0, None)]
    assert gpu0.gpu_uuid == UUID0
    assert gpu0.fields.gpu_util_pct == 87.0
    assert gpu0.fields.memory_util_pct == 41.0
    assert gpu0.fields.memory_used_bytes == 68304 * MIB
    assert gpu0.fields.memory_total_bytes == (68304 + 12133 + 613) * MIB
    assert gpu0.fields.power_w == pytest.approx(312.517)
    assert gpu0.fields.temperature_c == 61.0
    assert gpu0.fields.engine_active_ratio == pytest.approx(0.912345)
    assert gpu0.fields.ecc_corrected_volatile == 0
    assert gpu0.fields.last_xid is None  # the exporter's 0 means no XID yet
    assert gpu0.labels == {"pod": "llama-ft-0", "namespace": "ml-research", "container": "trainer"}

    # MIG: GPU-wide counters move to the GPU's own sample, each instance keeps its memory and activity.
    parent, small, large = by_key[(1, None)], by_key[(1, 1)], by_key[(1, 2)]
    assert parent.gpu_uuid == small.gpu_uuid == large.gpu_uuid == UUID1
    assert parent.fields.power_w == pytest.approx(121.25)
    assert parent.fields.temperature_c == 48.0
    assert parent.fields.memory_used_bytes is None
    assert small.fields.power_w is None and large.fields.power_w is None
    assert small.fields.memory_used_bytes == 2560 * MIB
    assert small.fields.memory_total_bytes == (2560 + 7168) * MIB
    assert small.fields.engine_active_ratio == pytest.approx(0.25)
    assert small.fields.gpu_util_pct is None
    assert small.labels == {"pod": "jupyter-alice", "namespace": "team-a", "container": "notebook"}
    assert large.labels == {}
    assert large.fields.memory_total_bytes == 39936 * MIB

    gpu2 = by_key[(2, None)]
    assert gpu2.fields.last_xid == 79
    assert gpu2.fields.ecc_corrected_volatile == 3
    assert gpu2.fields.ecc_uncorrected_volatile == 1
    assert gpu2.labels == {}
    for item in reading.samples:
        validate_sample(item, known_nodes={"gpu-node-7"})


def test_exporter_page_inventory() -> None:
    inventory = read_exporter_page(PAGE, node="gpu-node-7", scraped_at=5.0).inventory
    assert inventory.node == "gpu-node-7"
    assert inventory.driver_version == "550.54.15"
    assert [(g.index, g.uuid) for g in inventory.gpus] == [(0, UUID0), (1, UUID1), (2, UUID2)]
    assert {g.name for g in inventory.gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert inventory.gpus[0].pci_bus_id == "00000000:07:00.0"
    assert inventory.gpus[0].memory_total_bytes == (68304 + 12133 + 613) * MIB
    assert [g.mig_enabled for g in inventory.gpus] == [None, True, None]
    instances = inventory.gpus[1].mig_instances
    assert [(m.gpu_instance_id, m.profile, m.memory_total_bytes) for m in instances] == [
        (1, "1g.10gb", 9728 * MIB),
        (2, "3g.40gb", 39936 * MIB),
    ]


def test_configured_node_overrides_hostname_and_unlabelled_series_are_skipped() -> None:
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="pod-hostname-xyz"} 12\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",Hostname="pod-hostname-xyz"} 13\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",Hostname="pod-hostname-xyz"} NaN\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="3",UUID="GPU-d",Hostname="x"} 1 1700000000500\n'
    )
    reading = read_exporter_page(text, node="gpu-node-7", scraped_at=9.0)
    assert [(s.node, s.gpu_uuid) for s in reading.samples] == [
        ("gpu-node-7", "GPU-a"),
        ("gpu-node-7", "GPU-c"),
        ("gpu-node-7", "GPU-d"),
    ]
    assert reading.samples[0].fields.gpu_util_pct == 12.0
    assert reading.samples[1].fields.gpu_util_pct is None  # NaN: the exporter had no value
    assert reading.samples[2].timestamp == 1_700_000_000.5
    assert len(reading.errors) == 1 and "without UUID" in reading.errors[0]


_label_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
_label_values = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=200, deadline=None)
@given(
    name=st.from_regex(r"[A-Za-z_:][A-Za-z0-9_:]{0,20}", fullmatch=True),
    labels=st.dictionaries(_label_names, _label_values, max_size=5),
    value=st.floats(allow_nan=False),
    timestamp=st.none() | st.integers(min_value=0, max_value=2**53),
)
def test_any_rendered_series_parses_back(
    name: str, labels: dict[str, str], value: float, timestamp: int | None
) -> None:
    rendered = ",".join(f'{key}="{_escape(text)}"' for key, text in labels.items())
    value_text = {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, repr(value))
    line = f"{name}{{{rendered}}} {value_text}" + ("" if timestamp is None else f" {timestamp}")
    page = parse_exposition(line)
    assert page.errors == ()
    (metric,) = page.metrics
    assert (metric.name, dict(metric.labels), metric.value, metric.timestamp_ms) == (name, labels, value, timestamp)
