"""The agent process: option checks, the sampling and replay loops (on a fake clock), and the
command itself run as a subprocess against the fake NVML library."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from kumiki.agent.app import main, run_replay, run_sampling
from kumiki.agent.core import GpuDevice, GpuInventory, GpuSample, SampleFields, TickSchedule

from .conftest import FakeNvml
from .fake_nvml.build import FakeNvmlConfig

GIB = 1024**3


# -- options --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--node: required"),
        (["--node", "Bad_Name"], "--node: 'Bad_Name' is not a lowercase DNS-1123 name"),
        (["--node", "n1", "--interval-s", "fast"], "--interval-s: 'fast' is not a number"),
        (["--node", "n1", "--interval-s", "0"], "--interval-s: 0 is outside"),
        (["--node", "n1", "--duration-s", "-5"], "--duration-s: -5 is outside"),
        (["--node", "n1", "--source", "smi"], "--source: 'smi' is not one of nvml, dcgm"),
        (["--node", "n1", "--source", "dcgm", "--dcgm-url", "localhost:9400"], "--dcgm-url: "),
        (["--replay", "/nonexistent/rec"], "--replay: /nonexistent/rec is not a folder"),
        (["--node", "n1", "--speed", "-1"], "--speed: -1 is outside"),
        (["--node", "n1", "--log-level", "chatty"], "--log-level: 'chatty'"),
        (["--node", "n1", "--output", "/nonexistent/dir/out.jsonl"], "--output: folder /nonexistent/dir"),
        (["--node", "n1", "--inventory-interval-s", "-1"], "--inventory-interval-s: -1 is outside"),
        (
            ["--node", "n1", "--interval-s", "5", "--inventory-interval-s", "2"],
            "--inventory-interval-s: 2 is shorter than --interval-s 5",
        ),
        (["--node", "n1", "--token-file", "/nonexistent/token"], "--token-file: only with --output kafka"),
        (
            ["--node", "n1", "--output", "kafka", "--token-file", "/nonexistent/token"],
            "--token-file: cannot read '/nonexistent/token': No such file or directory",
        ),
        (["--node", "n1", "--node-key-file", "/nonexistent/key"], "--node-key-file: only with --output kafka"),
        (
            ["--node", "n1", "--output", "kafka", "--node-key-file", "/nonexistent/key"],
            "--node-key-file: cannot read '/nonexistent/key': No such file or directory",
        ),
        (
            ["--node", "n1", "--output", "kafka", "--token-file", "/t", "--node-key-file", "/k"],
            "--node-key-file: give --token-file (on Kubernetes) or --node-key-file, not both",
        ),
    ],
)
def test_bad_options_exit_2_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUMIKI_NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert message in error[0]


def test_record_and_replay_together_and_reused_record_folders_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "inventory.json").write_text("{}")
    with pytest.raises(SystemExit):
        main(["--replay", str(tmp_path), "--record", str(tmp_path / "copy")])
    assert "--record: cannot be combined with --replay" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--node", "n1", "--record", str(tmp_path)])
    assert "already holds a recording" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "content", "message"),
    [
        ("--token-file", "\n", "--token-file: {path!r} is empty"),
        (
            "--node-key-file",
            "not-a-key\n",
            "does not hold a node key (64 hex characters, from kumiki telemetry node-key)",
        ),
    ],
)
def test_a_proof_file_that_proves_nothing_is_refused_before_anything_starts(
    option: str, content: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proof = tmp_path / "proof"
    proof.write_text(content)
    with pytest.raises(SystemExit) as exited:
        main(["--node", "n1", "--output", "kafka", option, str(proof)])
    assert exited.value.code == 2
    assert message.format(path=str(proof)) in capsys.readouterr().err


# -- loops on a fake clock ------------------------------------------------------------------------


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScriptedSource:
    """Each tick takes `costs[tick]` seconds of the fake clock; a None cost raises instead."""

    def __init__(self, clock: FakeClock, costs: Sequence[float | None]) -> None:
        self.clock = clock
        self.costs = list(costs)
        self.tick_times: list[float] = []
        self.errors: Counter[str] = Counter({"power": 2})
        self.unsupported = {(0, "ecc")}

    async def open(self, now: float) -> GpuInventory:
        raise AssertionError("not used")

    async def sample(self, timestamp: float) -> Sequence[GpuSample]:
        self.tick_times.append(self.clock.now)
        cost = self.costs[len(self.tick_times) - 1]
        if cost is None:
            raise RuntimeError("driver hiccup")
        self.clock.now += cost
        return [GpuSample("n1", "GPU-0", 0, None, timestamp, SampleFields(gpu_util_pct=1.0))]

    async def close(self) -> None:
        pass


class ListSink:
    def __init__(self, fail_on: set[int] | None = None) -> None:
        self.batches: list[list[GpuSample]] = []
        self.inventories: list[GpuInventory] = []
        self.fail_on = fail_on or set()
        self.calls = 0

    async def publish(self, samples: Sequence[GpuSample]) -> None:
        self.calls += 1
        if self.calls in self.fail_on:
            raise ConnectionError("broker away")
        self.batches.append(list(samples))

    async def publish_inventory(self, inventory: GpuInventory) -> None:
        self.inventories.append(inventory)


async def test_sampling_keeps_the_grid_skips_overruns_and_survives_failures() -> None:
    clock = FakeClock()
    # Tick 1 overruns by 2.5 intervals; tick 3 raises; the sink fails on its second publish.
    source = ScriptedSource(clock, [0.1, 2.5, 0.1, None, 0.1, 0.1])
    sink = ListSink(fail_on={2})
    schedule = TickSchedule(interval_s=1.0, origin=clock.now, duration_s=6.0)
    stats = await run_sampling(source, sink, schedule, clock=clock, wall=clock, sleep=clock.sleep)
    assert [round(t - 1000.0, 6) for t in source.tick_times] == [0.0, 1.0, 4.0, 5.0]
    assert stats.ticks == 4
    assert stats.skipped_ticks == 2
    assert stats.tick_errors == 1
    assert stats.publish_errors == 1
    assert stats.samples == 2  # ticks at 0 and 5 published; 1 lost to the sink, 4 raised
    assert stats.source_errors == {"power": 2}
    assert stats.unsupported == ["gpu0:ecc"]


async def test_a_closed_output_stops_the_run_instead_of_failing_every_tick() -> None:
    clock = FakeClock()
    source = ScriptedSource(clock, [0.0] * 10)

    class ClosedPipe(ListSink):
        async def publish(self, samples: Sequence[GpuSample]) -> None:
            raise BrokenPipeError

    stats = await run_sampling(
        source, ClosedPipe(), TickSchedule(1.0, clock.now, 10.0), clock=clock, wall=clock, sleep=clock.sleep
    )
    assert stats.ticks == 1
    assert stats.publish_errors == 0


async def test_replay_paces_batches_shifts_time_and_relabels_the_node() -> None:
    clock = FakeClock(start=5000.0)
    recorded = [
        GpuSample("rec-node", f"GPU-{i}", i, None, t, SampleFields(gpu_util_pct=float(i)))
        for t in (100.0, 102.0, 106.0)
        for i in (0, 1)
    ]
    gpus = (GpuDevice(0, "GPU-0", None, None, None, None),)
    inventory = GpuInventory("rec-node", 99.0, "550", "12.4", gpus)
    sink = ListSink()
    stats = await run_replay(
        inventory,
        recorded,
        sink,
        speed=2.0,
        node="replica-3",
        keep_timestamps=False,
        clock=clock,
        wall=clock,
        sleep=clock.sleep,
    )
    assert stats.ticks == 3 and stats.samples == 6
    assert clock.sleeps == [1.0, 2.0]  # gaps of 2 s and 4 s at double speed
    assert sink.inventories[0].node == "replica-3"
    assert sink.inventories[0].collected_at == 99.0 + 4900.0
    assert [[s.timestamp for s in batch] for batch in sink.batches] == [[5000.0] * 2, [5002.0] * 2, [5006.0] * 2]
    assert {s.node for batch in sink.batches for s in batch} == {"replica-3"}


async def test_replay_at_speed_zero_never_waits_and_can_keep_timestamps() -> None:
    clock = FakeClock()
    recorded = [GpuSample("n", "GPU-0", 0, None, t, SampleFields()) for t in (1.0, 50.0, 900.0)]
    inventory = GpuInventory("n", 1.0, None, None, ())
    sink = ListSink()
    await run_replay(
        inventory, recorded, sink, speed=0, node=None, keep_timestamps=True, clock=clock, wall=clock, sleep=clock.sleep
    )
    assert clock.sleeps == []
    assert [batch[0].timestamp for batch in sink.batches] == [1.0, 50.0, 900.0]


# -- the command, as a process, on the fake NVML --------------------------------------------------


def two_gpu_node() -> FakeNvmlConfig:
    return FakeNvmlConfig(
        system={"driver_version": "535.161.08", "cuda_version": 12020},
        gpus=[
            {
                "uuid": "GPU-aaaa",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total": 80 * GIB,
                "memory_used": 7 * GIB,
                "util_gpu": [5, 95, 60],
                "util_memory": [1],
                "power_mw": 420000,
                "temperature_c": 55,
                "mig": "off",
                "nvlink_count": 18,
            },
            {
                "uuid": "GPU-bbbb",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total": 80 * GIB,
                "memory_used": 0,
                "util_gpu": [0],
                "util_memory": [0],
                "temperature_c": 30,
                "unsupported": "power",
                "mig": "off",
                "nvlink_count": 18,
            },
        ],
        nvlinks=[{"a": 0, "b": 1, "links": 18}],
        topology=[{"a": 0, "b": 1, "level": "SINGLE"}],
    )


def agent(fake_nvml: FakeNvml, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kumiki.agent", *argv],
        env=fake_nvml.subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_record_then_replay_through_the_real_loader(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    config = two_gpu_node()
    fake_nvml.configure(config)
    recording = tmp_path / "rec"
    done = agent(
        fake_nvml, "--node", "gpu-node-1", "--interval-s", "0.05", "--duration-s", "0.4", "--record", str(recording)
    )
    assert done.returncode == 0, done.stderr
    inventory = json.loads((recording / "inventory.json").read_text())
    assert inventory["node"] == "gpu-node-1"
    assert inventory["driver_version"] == "535.161.08"
    assert inventory["cuda_driver_version"] == "12.2"
    assert [g["uuid"] for g in inventory["gpus"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert inventory["pairs"] == [{"a": 0, "b": 1, "topology": "SINGLE", "nvlinks": 18, "nvlink_p2p": True}]
    recorded = [json.loads(line) for line in (recording / "samples.jsonl").read_text().splitlines()]
    summary = json.loads((recording / "summary.json").read_text())
    ticks = summary["ticks"]
    assert 1 <= ticks <= 8
    assert len(recorded) == 2 * ticks == summary["samples"]
    assert summary["unsupported"] == ["gpu1:power"]
    gpu0 = [s for s in recorded if s["gpu_index"] == 0]
    pattern = config.gpus[0]["util_gpu"]
    assert [s["fields"]["gpu_util_pct"] for s in gpu0] == [pattern[k % 3] for k in range(ticks)]
    assert {s["fields"]["power_w"] for s in gpu0} == {420.0}
    assert all("power_w" not in s["fields"] for s in recorded if s["gpu_index"] == 1)

    out = tmp_path / "replayed.jsonl"
    replayed = agent(fake_nvml, "--replay", str(recording), "--speed", "0", "--node", "replica-1", "--output", str(out))
    assert replayed.returncode == 0, replayed.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "inventory" and lines[0]["node"] == "replica-1"
    again = lines[1:]
    assert len(again) == len(recorded)
    shift = again[0]["timestamp"] - recorded[0]["timestamp"]
    for old, new in zip(recorded, again, strict=True):
        assert new["node"] == "replica-1"
        assert new["timestamp"] == pytest.approx(old["timestamp"] + shift)
        assert (new["gpu_uuid"], new["fields"]) == (old["gpu_uuid"], old["fields"])


def test_sigterm_ends_a_run_cleanly(fake_nvml: FakeNvml) -> None:
    fake_nvml.configure(two_gpu_node())
    process = subprocess.Popen(
        [sys.executable, "-m", "kumiki.agent", "--node", "gpu-node-1", "--interval-s", "0.05", "--output", "-"],
        env=fake_nvml.subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        sample = json.loads(process.stdout.readline())
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert first["kind"] == "inventory"
    assert sample["kind"] == "sample" and sample["gpu_uuid"] == "GPU-aaaa"
    assert process.returncode == 0, stderr
    assert "done: {'ticks'" in stderr


def test_nvml_that_will_not_start_exits_1_with_the_reason(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    fake_nvml.config_path.write_text("[gpu]\nmig = sometimes\n")
    done = agent(fake_nvml, "--node", "gpu-node-1", "--duration-s", "1")
    assert done.returncode == 1
    assert "NVML could not be initialised" in done.stderr
    assert done.stdout == ""


# -- dcgm-exporter ingest registers the node before its first sample -------------------------------


async def test_dcgm_ingest_publishes_its_synthetic_inventory_before_any_sample() -> None:
    """Telemetry rejects samples of unregistered nodes and relies on this order (docs/telemetry.md)."""
    from aiohttp import web

    from kumiki.agent.app import AgentConfig, _run_live

    page = (Path(__file__).parent / "fixtures" / "dcgm_exporter_a100_mig.prom").read_text(encoding="utf-8")
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain")

    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    calls: list[tuple[str, str]] = []

    class OrderSink(ListSink):
        async def publish(self, samples: Sequence[GpuSample]) -> None:
            calls.extend(("sample", sample.node) for sample in samples)

        async def publish_inventory(self, inventory: GpuInventory) -> None:
            calls.append(("inventory", inventory.node))
            self.inventories.append(inventory)

    sink = OrderSink()
    config = AgentConfig(
        node="gpu-node-7",
        source="dcgm",
        interval_s=0.05,
        duration_s=0.2,
        output=None,
        record_dir=None,
        replay_dir=None,
        dcgm_url=f"http://127.0.0.1:{port}/metrics",
        speed=1.0,
        keep_timestamps=False,
        log_level="WARNING",
    )
    try:
        stats = await _run_live(config, sink, None)
    finally:
        await runner.cleanup()
    assert stats is not None and stats.samples > 0
    assert calls[0] == ("inventory", "gpu-node-7")
    assert set(calls[1:]) == {("sample", "gpu-node-7")}
    assert [gpu.uuid[-2:] for gpu in sink.inventories[0].gpus] == ["50", "51", "52"]


class ReopeningSource(ScriptedSource):
    """Every re-read returns the next of `inventories`; None raises (the driver refused)."""

    def __init__(self, clock: FakeClock, inventories: Sequence[GpuInventory | None]) -> None:
        super().__init__(clock, [0.0] * 20)
        self.inventories = list(inventories)

    async def reopen(self, now: float) -> GpuInventory:
        inventory = self.inventories.pop(0)
        if inventory is None:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return inventory


async def test_a_failed_re_read_keeps_the_old_inventory_and_a_failed_publish_is_tried_again() -> None:
    from dataclasses import replace

    clock = FakeClock()
    before = GpuInventory("n1", 1.0, "550", None, (GpuDevice(0, "GPU-0", "A100", None, None, False),))
    changed = replace(before, gpus=(GpuDevice(0, "GPU-0", "A100", None, None, True),))
    source = ReopeningSource(clock, [None, changed, changed, changed])
    sink = ListSink()
    fail_first = [True]

    async def publish_inventory(inventory: GpuInventory) -> None:
        if fail_first.pop(0) if fail_first else False:
            raise ConnectionError("broker away")
        sink.inventories.append(inventory)

    sink.publish_inventory = publish_inventory  # type: ignore[method-assign]
    stats = await run_sampling(
        source, sink, TickSchedule(1.0, clock(), 5.0), clock=clock, sleep=clock.sleep,
        inventory=before, inventory_sink=sink, inventory_every_s=1.0,
    )  # fmt: skip
    # re-read 1 raises; re-read 2 finds the change but cannot publish it; re-read 3 publishes it; 4 finds nothing
    assert (stats.inventory_errors, stats.inventory_changes) == (2, 1)
    assert sink.inventories == [changed]
    assert stats.ticks == 5
