"""Fair share: guarantees first, then weighted DRF over idle capacity, with decayed usage."""

from __future__ import annotations

from typing import Any

import pytest

from kumiki.quota.core import ANY_MODEL, Queue, Resources, build_config, decay_factor, fair_shares


def share_config() -> Any:
    queues = [
        Queue("a", None, {}, weight=2.0),
        Queue("b", None, {}, weight=1.0),
        Queue("c", None, {ANY_MODEL: 2}, weight=1.0),
    ]
    return build_config(queues, {"gpu": 12.0}, cpu_milli=12_000, memory_mib=12_000)


def test_idle_capacity_is_split_by_weight_after_guarantees() -> None:
    config = share_config()
    demand = {"a": Resources(100), "b": Resources(100), "c": Resources(100)}
    shares = fair_shares(config, demand)
    # c first gets its guarantee of 2; the other 10 GPUs go 2:1:1 by weight
    assert shares["a"].gpus == pytest.approx(5.0, abs=1e-6)
    assert shares["b"].gpus == pytest.approx(2.5, abs=1e-6)
    assert shares["c"].gpus == pytest.approx(4.5, abs=1e-6)
    assert sum(s.gpus for s in shares.values()) <= 12.0


def test_demand_caps_the_share_and_the_rest_goes_to_others() -> None:
    shares = fair_shares(share_config(), {"a": Resources(1), "b": Resources(100)})
    assert shares["a"].gpus == pytest.approx(1.0)
    assert shares["b"].gpus == pytest.approx(11.0, abs=1e-6)
    assert shares["c"].gpus == 0


def test_dominant_resource_not_gpus_limits_a_cpu_heavy_queue() -> None:
    config = build_config([Queue("a", None, {}), Queue("b", None, {})], {"gpu": 10.0}, cpu_milli=100, memory_mib=100)
    # a wants CPU-heavy work (dominant: cpu), b GPU-heavy; equal weights equalise dominant shares
    shares = fair_shares(config, {"a": Resources(10, 100, 0), "b": Resources(10, 0, 0)})
    dominant_a = shares["a"].dominant_share(config.total_capacity)
    dominant_b = shares["b"].dominant_share(config.total_capacity)
    assert dominant_a == pytest.approx(dominant_b, rel=1e-6)
    assert shares["a"].cpu_milli <= 100 + 1e-9


def test_recent_heavy_use_yields_share_and_decays_with_half_life() -> None:
    config = build_config([Queue("a", None, {}), Queue("b", None, {})], {"gpu": 10.0})
    demand = {"a": Resources(100), "b": Resources(100)}
    heavy = fair_shares(config, demand, {"a": Resources(1000.0), "b": Resources(0.0)})
    assert heavy["a"].gpus < heavy["b"].gpus
    aged = Resources(1000.0).scaled(decay_factor(10 * 3600, 3600))
    nearly_even = fair_shares(config, demand, {"a": aged, "b": Resources(1.0)})
    assert abs(nearly_even["a"].gpus - nearly_even["b"].gpus) < abs(heavy["a"].gpus - heavy["b"].gpus)
    assert decay_factor(3600, 3600) == pytest.approx(0.5)


def test_hierarchical_shares_split_inside_the_parent() -> None:
    queues = [
        Queue("org", None, {}, weight=1.0),
        Queue("org/x", "org", {}, weight=3.0),
        Queue("org/y", "org", {}, weight=1.0),
        Queue("other", None, {}, weight=1.0),
    ]
    config = build_config(queues, {"gpu": 16.0})
    shares = fair_shares(config, {"org/x": Resources(100), "org/y": Resources(100), "other": Resources(100)})
    assert shares["org"].gpus == pytest.approx(8.0, abs=1e-6)
    assert shares["org/x"].gpus == pytest.approx(6.0, abs=1e-6)
    assert shares["org/y"].gpus == pytest.approx(2.0, abs=1e-6)
