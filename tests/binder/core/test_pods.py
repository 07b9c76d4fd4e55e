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


def test_image_and_command_and_args_are_read_from_the_first_container() -> None:
    obj = pod_object("ns", "p", gpus=1)
    obj["spec"]["containers"][0].update(command=["python", "train.py"], args=["--epochs", "3"])
    obj["spec"]["containers"].append({"name": "sidecar", "image": "registry.example/log:2", "command": ["tail"]})
    pod = core.parse_pod(obj)
    assert pod.image == "registry.example/train:1"
    assert pod.command == "python train.py --epochs 3"
    args_only = pod_object("ns", "q", gpus=1)
    args_only["spec"]["containers"][0]["args"] = ["--lr", 0.1]  # the image's entrypoint runs them
    assert core.parse_pod(args_only).command == "--lr 0.1"
    bare = pod_object("ns", "r", gpus=1)
    del bare["spec"]["containers"][0]["image"]
    assert (core.parse_pod(bare).image, core.parse_pod(bare).command) == ("", "")
    assert (core.parse_pod({"metadata": {"name": "empty"}}).image, core.parse_pod({}).command) == ("", "")


def test_a_long_command_is_cut_at_1024_characters() -> None:
    obj = pod_object("ns", "p", gpus=1)
    obj["spec"]["containers"][0].update(command=["python", "train.py"], args=["--x=" + "a" * 2000])
    command = core.parse_pod(obj).command
    assert core.COMMAND_MAX_CHARS == 1024
    assert len(command) == 1024 and command == ("python train.py --x=" + "a" * 2000)[:1024]
    exact = pod_object("ns", "q", gpus=1)
    exact["spec"]["containers"][0]["command"] = ["b" * 1024]
    assert core.parse_pod(exact).command == "b" * 1024


def test_a_known_pod_keeps_its_time_limit_and_reads_image_and_command() -> None:
    obj = pod_object("ns", "p", gpus=1)
    obj["metadata"]["uid"] = "u1"
    obj["metadata"]["annotations"][core.TIME_LIMIT_ANNOTATION] = "2h"
    known = core.parse_pod(obj)
    assert known.time_limit_s == 7200.0
    obj["metadata"]["annotations"][core.TIME_LIMIT_ANNOTATION] = "1h"
    obj["spec"]["containers"][0]["command"] = ["python", "eval.py"]
    again = core.parse_pod(obj, known)  # the request is taken as it was read, the time limit with it
    assert again.time_limit_s == 7200.0 and again.invalid == ""
    assert again.command == "python eval.py"
