"""kumiki.telemetry.core.chunks: readings grouped per node and bucket, MIG instances under their own keys."""

from __future__ import annotations

import json

from kumiki.telemetry import core
from tests.telemetry.core.support import reading


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
