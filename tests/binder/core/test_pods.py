"""A pod read from the API: its request, gang, queue and creation time."""

from __future__ import annotations

import pytest

from kumiki.binder import core
from kumiki.sched.jobs import PodRequest
from tests.binder.support import pod_object


def test_whole_gpus_cpu_and_memory_and_the_gang_label() -> None:
    pod = core.parse_pod(pod_object("ns", "p", gpus=4, cpu="1500m", memory="2Gi", group="g"))
    assert pod.invalid == ""
    assert pod.resources == PodRequest(gpus=4, cpu_milli=1500, memory_mib=2048)
    assert pod.job_id == "ns/g" and pod.queue == "ns"
    alone = core.parse_pod(pod_object("ns", "solo", gpus=1, labels={core.QUEUE_LABEL: "team-a"}))
    assert alone.job_id == "ns/pod/solo" and alone.queue == "team-a"


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-12-01T18:00:05Z", 1796148005.0),
        ("2026-12-01T18:00:05+00:00", 1796148005.0),
        ("", 0.0),  # absent: bound all the same, left out of the latency histogram
        ("yesterday", 0.0),
        ("2026-12-01T18:00:05", 0.0),  # no zone: not a time the API server writes
        (1796148005, 0.0),
    ],
)
def test_creation_timestamp_for_the_pod_scheduling_latency(stamp: object, expected: float) -> None:
    obj = pod_object("ns", "p", gpus=1)
    obj["metadata"]["creationTimestamp"] = stamp
    assert core.parse_pod(obj).created_unix_s == expected
