"""The pure quota rules: queue file validation, admission, reclaim victims, fair share, ledger arithmetic."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kumiki.common.contracts.v1 import events_pb2
from kumiki.data import TRACES_DIR
from kumiki.quota.core import (
    ANY_MODEL,
    AdmitRequest,
    Holding,
    Ledger,
    Outcome,
    Queue,
    QueueConfigError,
    Resources,
    build_config,
    choose_victims,
    decay_factor,
    decide_admission,
    fair_shares,
    flat_config,
    gpu_seconds,
    guarantee_headroom,
    may_submit,
    overlap_micros,
    parse_config,
    queue_statuses,
    team_of,
    timestamp_micros,
)
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "docs" / "examples" / "queues.yaml"


def example() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(data, dict)
    return data


def queue_entry(data: dict[str, Any], path: str) -> dict[str, Any]:
    for entry in data["queues"]:
        if (f"{entry['parent']}/{entry['name']}" if entry.get("parent") else entry["name"]) == path:
            return dict(entry)
    raise KeyError(path)


def replace_entry(data: dict[str, Any], path: str, **changes: Any) -> dict[str, Any]:
    entries = []
    for entry in data["queues"]:
        full = f"{entry['parent']}/{entry['name']}" if entry.get("parent") else entry["name"]
        entries.append({**entry, **changes} if full == path else entry)
    return {**data, "queues": entries}


# --- validation ---------------------------------------------------------------------------------------------


def test_example_file_is_valid_and_builds_the_tree() -> None:
    config = parse_config(example())
    assert config.is_leaf("acme/research/vision")
    assert not config.is_leaf("acme/research")
    assert [q.path for q in config.ancestors("acme/research/vision")] == [
        "acme",
        "acme/research",
        "acme/research/vision",
    ]
    assert config.queues["acme/product/search"].guarantees == {ANY_MODEL: 16.0}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: {**d, "queues": [*d["queues"], {"name": "x", "parent": "nowhere"}]}, "queue nowhere/x: parent:"),
        (lambda d: replace_entry(d, "acme/batch", guarantee=-1), "queue acme/batch: guarantee: must be"),
        (
            lambda d: replace_entry(d, "acme/research/vision", guarantee={"A100-80GB": 40}),
            "queue acme/research/vision: guarantee",
        ),
        (
            lambda d: replace_entry(d, "acme/research/language", guarantee={"A100-80GB": 20, "H100-80GB": 16}),
            "queue acme/research: guarantee: children's guarantees add up to 52",
        ),
        (lambda d: replace_entry(d, "acme/research", limit=10), "queue acme/research: limit: 10 is below"),
        (lambda d: replace_entry(d, "acme/batch", weight=0), "queue acme/batch: weight: must be a finite number > 0"),
        (lambda d: replace_entry(d, "acme/batch", colour="red"), "queue acme/batch: colour: unknown field"),
        (lambda d: replace_entry(d, "acme/batch", owners="erin"), "queue acme/batch: owners: expected a list"),
        (lambda d: replace_entry(d, "acme/batch", guarantee={"V100": 1}), "queue acme/batch: guarantee.V100: GPU"),
        (lambda d: {**d, "queues": [*d["queues"], {"name": "batch", "parent": "acme"}]}, "queue acme/batch: name:"),
        (lambda d: {**d, "cluster": {"gpus": {}}}, "cluster: gpus:"),
    ],
)
def test_invalid_queue_files_name_the_queue_and_field(mutate: Any, expected: str) -> None:
    with pytest.raises(QueueConfigError) as error:
        parse_config(mutate(example()))
    assert str(error.value).startswith(expected), str(error.value)


def test_owners_of_an_ancestor_may_submit() -> None:
    config = parse_config(example())
    assert may_submit(config, "alice", "acme/research/vision")
    assert may_submit(config, "research-leads", "acme/research/vision")
    assert not may_submit(config, "carol", "acme/research/vision")


# --- admission ----------------------------------------------------------------------------------------------


def small_config(**batch: Any) -> Any:
    """root (limit none) -> a (guarantee 4), b (guarantee 4, limit 6), batch (guarantee 0); 10 GPUs."""
    queues = [
        Queue("root", None, {ANY_MODEL: 8}),
        Queue("root/a", "root", {ANY_MODEL: 4}, owners=frozenset({"alice"})),
        Queue("root/b", "root", {ANY_MODEL: 4}, limit_gpus=6),
        Queue("root/batch", "root", {}, **batch),
    ]
    return build_config(queues, {"gpu": 10.0})


def request(queue: str, gpus: float, *, preemptible: bool = False, tier: int = 0, job: str = "j") -> AdmitRequest:
    return AdmitRequest(job, 1, queue, gpus, ANY_MODEL, tier, preemptible)


def test_inside_the_guarantee_is_admitted_without_borrowing() -> None:
    config = small_config()
    decision = decide_admission(config, [Holding("root/a", 1)], request("root/a", 3))
    assert decision.outcome is Outcome.ADMITTED and decision.shortfall_gpus == 0


def test_beyond_the_guarantee_only_preemptible_work_borrows_idle_gpus() -> None:
    config = small_config()
    held = [Holding("root/a", 4)]
    assert decide_admission(config, held, request("root/a", 2)).code == "quota_exceeded"
    borrowed = decide_admission(config, held, request("root/a", 6, preemptible=True))
    assert borrowed.outcome is Outcome.BORROWED
    denied = decide_admission(config, held, request("root/a", 7, preemptible=True))
    assert denied.code == "insufficient_gpus" and "6 idle" in denied.message


def test_low_tier_borrows_every_idle_gpu_while_nobody_needs_them() -> None:
    config = small_config()
    held: list[Holding] = []
    for index in range(10):
        decision = decide_admission(config, held, request("root/batch", 1, preemptible=True, job=f"b{index}"))
        assert decision.outcome is Outcome.BORROWED
        held.append(Holding("root/batch", 1, borrowed=True, job_id=f"b{index}"))
    assert decide_admission(config, held, request("root/batch", 1, preemptible=True)).code == "insufficient_gpus"


def test_guaranteed_work_is_admitted_when_lent_out_and_names_the_shortfall() -> None:
    config = small_config()
    held = [Holding("root/batch", 9, borrowed=True)]
    decision = decide_admission(config, held, request("root/a", 3))
    assert decision.outcome is Outcome.ADMITTED
    assert decision.shortfall_gpus == pytest.approx(2.0)


def test_limit_caps_the_subtree_including_borrowed_work() -> None:
    config = small_config()
    held = [Holding("root/b", 4), Holding("root/b", 1, borrowed=True)]
    decision = decide_admission(config, held, request("root/b", 2, preemptible=True))
    assert decision.code == "limit_exceeded" and "queue root/b" in decision.message and "limit of 6" in decision.message


def test_tier_and_leaf_and_unknown_queue_are_denied_with_reasons() -> None:
    config = small_config(priority_tiers=frozenset({0}))
    assert decide_admission(config, [], request("root/batch", 1, preemptible=True, tier=3)).code == "tier_not_allowed"
    assert decide_admission(config, [], request("root", 1)).code == "queue_not_leaf"
    assert decide_admission(config, [], request("nope", 1)).code == "unknown_queue"


def test_guarantee_per_model_spills_into_the_any_model_guarantee() -> None:
    queue = Queue("q", None, {"A100": 4, ANY_MODEL: 2})
    assert guarantee_headroom(queue, {}, "A100") == 6
    assert guarantee_headroom(queue, {"A100": 5}, "A100") == 1
    assert guarantee_headroom(queue, {"A100": 5}, "H100") == 1
    assert guarantee_headroom(queue, {"H100": 2}, "A100") == 4
    assert guarantee_headroom(queue, {ANY_MODEL: 3}, "A100") == 3


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["root/a", "root/b", "root/batch"]), st.integers(1, 4), st.booleans()), max_size=30
    )
)
def test_admissions_never_break_limits_and_borrowing_never_exceeds_capacity(steps: list[tuple[str, int, bool]]) -> None:
    config = small_config()
    held: list[Holding] = []
    for index, (queue, gpus, preemptible) in enumerate(steps):
        decision = decide_admission(config, held, request(queue, gpus, preemptible=preemptible, job=f"j{index}"))
        if decision.admitted:
            held.append(Holding(queue, gpus, borrowed=decision.outcome is Outcome.BORROWED, job_id=f"j{index}"))
        assert sum(h.gpus for h in held if h.queue == "root/b") <= 6
        guaranteed = sum(h.gpus for h in held if not h.borrowed)
        assert guaranteed <= 8  # the sum of guarantees
        if decision.outcome is Outcome.BORROWED:
            assert sum(h.gpus for h in held) <= 10


# --- reclaim ------------------------------------------------------------------------------------------------


def test_victims_come_from_the_most_over_quota_queue_first() -> None:
    config = small_config()
    held = [
        Holding("root/b", 4),
        Holding("root/b", 2, borrowed=True, job_id="b-borrow", generation=1, seq=10),
        Holding("root/batch", 1, borrowed=True, job_id="x1", generation=1, seq=1),
        Holding("root/batch", 1, borrowed=True, job_id="x2", generation=1, seq=2),
        Holding("root/batch", 1, borrowed=True, job_id="x3", generation=1, seq=3),
    ]
    victims, uncovered = choose_victims(config, held, 3, "root/a")
    # batch is 3 over its guarantee, b 2 over: batch loses its latest admission first; then both are 2 over
    # and the latest admission of the two (b's) goes, which covers the need.
    assert [v.job_id for v in victims] == ["x3", "b-borrow"]
    assert uncovered == 0


def test_guaranteed_work_is_never_a_victim_and_shortfall_is_reported() -> None:
    config = small_config()
    held = [Holding("root/b", 4, job_id="b", generation=1), Holding("root/batch", 1, borrowed=True, job_id="x")]
    victims, uncovered = choose_victims(config, held, 3, "root/a")
    assert [v.job_id for v in victims] == ["x"]
    assert uncovered == pytest.approx(2.0)


def test_kai_1750_reclaim_from_over_quota_sibling_despite_a_protected_lower_priority_queue() -> None:
    """kai-scheduler/KAI-Scheduler#1750: root -> org-parent -> {reclaimer (under its guarantee), batch (over
    its guarantee of 0)}, and an unrelated protected queue (under its guarantee, lower-priority work). Reclaim
    must take batch's borrowed work and never the protected queue's, and must not give up because of it."""
    queues = [
        Queue("org-parent", None, {ANY_MODEL: 6}),
        Queue("org-parent/reclaimer", "org-parent", {ANY_MODEL: 4}),
        Queue("org-parent/batch", "org-parent", {}),
        Queue("protected", None, {ANY_MODEL: 4}),
    ]
    config = build_config(queues, {"gpu": 10.0})
    held = [
        Holding("protected", 3, priority_tier=0, job_id="protected-low", generation=1, seq=1),
        Holding("org-parent/batch", 3, borrowed=True, priority_tier=5, job_id="batch-1", generation=1, seq=2),
        Holding("org-parent/batch", 3, borrowed=True, priority_tier=5, job_id="batch-2", generation=1, seq=3),
    ]
    decision = decide_admission(config, held, request("org-parent/reclaimer", 4, job="pending"))
    assert decision.outcome is Outcome.ADMITTED and decision.shortfall_gpus == pytest.approx(3.0)
    victims, uncovered = choose_victims(config, held, decision.shortfall_gpus, "org-parent/reclaimer")
    assert [v.job_id for v in victims] == ["batch-2"]
    assert uncovered == 0
    # control: the protected queue stays protected even when nothing else could cover the need
    victims, uncovered = choose_victims(config, held[:1], 3, "org-parent/reclaimer")
    assert victims == [] and uncovered == 3


def test_victim_side_within_its_guarantee_at_the_diverging_level_is_protected() -> None:
    # team-x's leaf borrowed beyond its own guarantee, but its parent is within the parent's guarantee:
    # a queue in another organisation cannot take it.
    queues = [
        Queue("org1", None, {ANY_MODEL: 6}),
        Queue("org1/x", "org1", {ANY_MODEL: 2}),
        Queue("org2", None, {ANY_MODEL: 4}),
        Queue("org2/y", "org2", {ANY_MODEL: 4}),
    ]
    config = build_config(queues, {"gpu": 10.0})
    held = [Holding("org1/x", 2), Holding("org1/x", 3, borrowed=True, job_id="x-borrow")]
    assert choose_victims(config, held, 3, "org2/y")[0] == []
    # its sibling under the same organisation can
    config2 = build_config([*queues[:2], Queue("org1/z", "org1", {ANY_MODEL: 4}), *queues[2:]], {"gpu": 10.0})
    assert [v.job_id for v in choose_victims(config2, held, 3, "org1/z")[0]] == ["x-borrow"]


# --- fair share ---------------------------------------------------------------------------------------------


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


def test_queue_status_reports_borrowed_and_lent() -> None:
    config = small_config()  # 10 GPUs, guarantees a 4, b 4 (2 unguaranteed)
    held = [Holding("root/a", 1), Holding("root/batch", 5, borrowed=True)]
    statuses = {s.queue: s for s in queue_statuses(config, held)}
    assert statuses["root/batch"].borrowed_gpus == 5
    # 5 borrowed: 2 from unguaranteed capacity, 3 from the 3 + 4 unused guarantee of a and b
    assert statuses["root/a"].lent_gpus + statuses["root/b"].lent_gpus == pytest.approx(3.0)
    assert statuses["root/a"].lent_gpus == pytest.approx(3.0 * 3 / 7)
    assert statuses["root"].used_gpus == 6


# --- ledger -------------------------------------------------------------------------------------------------


def test_ledger_meters_from_running_to_stop_exactly_once() -> None:
    ledger = Ledger()
    base = timestamp_micros(1_700_000_000, 0)
    running = events_pb2.JOB_STATE_RUNNING
    common = {"queue": "q", "gpu_model": "A100", "gpus": Decimal("0.46")}
    assert ledger.apply(job_id="j", generation=1, state=running, at_us=base, **common) is None
    ledger.apply(job_id="j", generation=1, state=running, at_us=base + 5_000_000, **common)  # repeated: ignored
    entry = ledger.apply(job_id="j", generation=1, state=events_pb2.JOB_STATE_PREEMPTED, at_us=base + 1_500_001)
    assert entry is not None and entry.gpu_seconds == Decimal("0.46") * Decimal("1.500001")
    assert ledger.apply(job_id="j", generation=1, state=events_pb2.JOB_STATE_COMPLETED, at_us=base + 9_000_000) is None
    ledger.apply(job_id="j", generation=1, state=running, at_us=base + 9_000_000, **common)  # late replay
    assert ("j", 1) not in ledger.open
    assert ledger.apply(job_id="k", generation=1, state=events_pb2.JOB_STATE_COMPLETED, at_us=base) is None
    assert ledger.apply(job_id="j", generation=2, state=events_pb2.JOB_STATE_RESUMED, at_us=base) is None
    assert ledger.total_gpu_seconds() == Decimal("0.69000046")


def test_ledger_meters_the_allocation_from_bound_and_running_does_not_restart_it() -> None:
    """A job bound for 25 s and released as completed is billed 8 x 25 GPU-seconds (it was 0 when only RUNNING
    opened the meter); a RUNNING reported later by a cluster integration neither restarts nor doubles it."""
    ledger = Ledger()
    base = timestamp_micros(1_700_000_000, 0)
    common = {"queue": "research", "gpus": Decimal(8)}
    ledger.apply(job_id="demo", generation=1, state=events_pb2.JOB_STATE_BOUND, at_us=base, **common)
    ledger.apply(job_id="demo", generation=1, state=events_pb2.JOB_STATE_RUNNING, at_us=base + 3_000_000, **common)
    entry = ledger.apply(job_id="demo", generation=1, state=events_pb2.JOB_STATE_COMPLETED, at_us=base + 25_000_000)
    assert entry is not None and entry.start_us == base and entry.gpu_seconds == Decimal(200)
    # an integration that binds outside placement reports only RUNNING: that opens the meter
    ledger.apply(job_id="ext", generation=1, state=events_pb2.JOB_STATE_RUNNING, at_us=base, **common)
    assert ("ext", 1) in ledger.open


def test_interval_arithmetic_is_exact_and_windows_split_intervals() -> None:
    assert timestamp_micros(10, 999_999_999) == 10_999_999
    assert gpu_seconds(Decimal("3"), 0, 1) == Decimal("0.000003")
    assert overlap_micros(0, 100, 50, 200) == 50
    assert overlap_micros(0, 100, 100, 200) == 0
    whole = gpu_seconds(Decimal("2"), 0, 7_200_000_000)
    halves = gpu_seconds(Decimal("2"), 0, 3_600_000_000) + gpu_seconds(Decimal("2"), 3_600_000_000, 7_200_000_000)
    assert whole == halves == Decimal(14_400)


def test_team_is_the_first_two_levels() -> None:
    assert team_of("acme/research/vision") == "acme/research"
    assert team_of("solo") == "solo"


def test_philly_vcs_as_flat_queues_scaled_to_a_smaller_cluster() -> None:
    """How the simulator builds its queues: VC guarantees follow philly-vc-nodes.csv (8 GPUs a node),
    scaled from the 2,816-GPU cluster to 64 x 8."""
    lines = (TRACES_DIR / "philly-vc-nodes.csv").read_text().splitlines()[1:]
    guarantees = {vc: int(nodes) * 8.0 for vc, nodes in (line.split(",") for line in lines)}
    config = flat_config(guarantees, 512, scale=512 / sum(guarantees.values()))
    assert sum(queue.guaranteed_gpus for queue in config.queues.values()) == pytest.approx(512)
    biggest = max(config.queues.values(), key=lambda queue: queue.guaranteed_gpus)
    smallest = min(config.queues.values(), key=lambda queue: queue.guaranteed_gpus)
    inside = decide_admission(config, [], request(biggest.path, biggest.guaranteed_gpus // 2))
    assert inside.outcome is Outcome.ADMITTED
    beyond = decide_admission(config, [], request(smallest.path, 64, preemptible=True))
    assert beyond.outcome is Outcome.BORROWED
