"""What the quota core tests share: the example queue file and a small tree with a request builder."""

from __future__ import annotations

from typing import Any

import yaml

from kumiki.quota.core import ANY_MODEL, AdmitRequest, Queue, build_config
from tests.conftest import REPO_ROOT

EXAMPLE = REPO_ROOT / "docs" / "examples" / "queues.yaml"


def example() -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE.read_text())
    assert isinstance(data, dict)
    return data


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
