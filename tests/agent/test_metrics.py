"""The node agent's /metrics: the run's counts as Prometheus counters, and the option that turns it on.

A real agent process is scraped by a real Prometheus in tests/observability/test_prometheus.py."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from kumiki.agent.app import main, run_sampling
from kumiki.agent.core import TickSchedule
from tests.agent.test_app import FakeClock, ListSink, ScriptedSource


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_run_is_counted_per_node_with_errors_by_stage() -> None:
    clock = FakeClock()
    source = ScriptedSource(clock, [0.1, 2.5, 0.1, None, 0.1, 0.1])  # as test_app: overrun, raise, sink failure
    schedule = TickSchedule(interval_s=1.0, origin=clock.now, duration_s=6.0)
    stats = await run_sampling(
        source, ListSink(fail_on={2}), schedule, clock=clock, wall=clock, sleep=clock.sleep, metrics_node="metered"
    )
    assert value("kumiki_agent_ticks_total", node="metered") >= stats.ticks == 4
    assert value("kumiki_agent_samples_total", node="metered") == stats.samples == 2
    assert value("kumiki_agent_skipped_ticks_total", node="metered") == stats.skipped_ticks == 2
    assert value("kumiki_agent_errors_total", node="metered", stage="tick") == 1
    assert value("kumiki_agent_errors_total", node="metered", stage="publish") == 1
    assert value("kumiki_agent_errors_total", node="metered", stage="source:power") == 2, "counted once, not per tick"
    assert value("kumiki_agent_last_sample_timestamp_seconds", node="metered") == pytest.approx(
        1004.0
    )  # the tick at 4 s published last


async def test_without_a_node_label_nothing_is_counted() -> None:
    clock = FakeClock()
    before = value("kumiki_agent_ticks_total", node="n1")
    await run_sampling(
        ScriptedSource(clock, [0.1]), ListSink(), TickSchedule(1.0, clock.now, 1.0), clock=clock, wall=clock,
        sleep=clock.sleep,
    )  # fmt: skip
    assert value("kumiki_agent_ticks_total", node="n1") == before


@pytest.mark.parametrize("port", ["abc", "0", "70000", "80.5"])
def test_a_bad_metrics_port_exits_2_naming_the_option(
    port: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUMIKI_AGENT_METRICS_PORT", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["--node", "n1", "--metrics-port", port])
    assert exited.value.code == 2
    assert "--metrics-port:" in capsys.readouterr().err
