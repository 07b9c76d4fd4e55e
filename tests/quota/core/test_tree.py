"""The queue tree: the example file, validation errors that name the queue and field, flat simulator queues."""

from __future__ import annotations

from typing import Any

import pytest

from kumiki.data import TRACES_DIR
from kumiki.quota.core import ANY_MODEL, Outcome, QueueConfigError, decide_admission, flat_config, parse_config
from tests.quota.core.helpers import example, request


def replace_entry(data: dict[str, Any], path: str, **changes: Any) -> dict[str, Any]:
    entries = []
    for entry in data["queues"]:
        full = f"{entry['parent']}/{entry['name']}" if entry.get("parent") else entry["name"]
        entries.append({**entry, **changes} if full == path else entry)
    return {**data, "queues": entries}


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
