"""How a gang's pods end its job, when it is ready to submit, its BindRequest."""

from __future__ import annotations

from kumiki.binder import core
from kumiki.sched.jobs import PodRequest
from tests.binder.support import pod_object


def test_gang_outcomes_and_readiness() -> None:
    def pod(name: str, phase: str, node: str = "n") -> core.Pod:
        obj = pod_object("ns", name, gpus=1, group="g")
        obj["spec"]["nodeName"] = node
        obj["status"] = {"phase": phase}
        return core.parse_pod(obj)

    assert core.gang_outcome([pod("a", "Succeeded"), pod("b", "Succeeded")]) == "completed"
    assert core.gang_outcome([pod("a", "Succeeded"), pod("b", "Failed")]) == "failed"
    assert core.gang_outcome([pod("a", "Failed"), pod("b", "Running")]) is None  # not ended while one runs
    assert core.gang_outcome([pod("a", "Succeeded"), pod("b", "Running")]) is None
    assert core.gang_outcome([]) is None
    gang = core.Gang(job_id="ns/g", namespace="ns", group="g", min_member=3)
    for name in ("a", "b"):
        waiting = pod(name, "Pending", node="")
        gang.pods[waiting.key] = waiting
    assert not gang.ready_to_submit()
    third = pod("c", "Pending", node="")
    gang.pods[third.key] = third
    assert gang.ready_to_submit()
    assert core.bind_request_fields(gang, gang.waiting())["min_members"] == 3


def test_same_requests_ignores_node_rules_and_refuses_what_it_cannot_compare() -> None:
    logged = PodRequest(gpus=2, cpu_milli=1000, nodes=frozenset({"n1"}), avoid_nodes=frozenset({"n2"}))
    assert core.same_requests([logged], [PodRequest(gpus=2, cpu_milli=1000)])
    preferring = PodRequest(gpus=2, cpu_milli=1000, node_preference=(("n1", 200),))
    assert core.same_requests([preferring], [PodRequest(gpus=2, cpu_milli=1000)])
    assert not core.same_requests([logged], [PodRequest(gpus=2, cpu_milli=2000)])
    assert not core.same_requests([None], [PodRequest(gpus=2)])  # a logged request that was not one
    assert not core.same_requests([logged], [None])  # an invalid pod
    assert not core.same_requests([logged], [])


def test_submit_order_is_priority_then_oldest_pod_then_job_id() -> None:
    def gang(name: str, created: str, priority: int = 0) -> core.Gang:
        obj = pod_object("ns", name, gpus=1)
        obj["metadata"]["creationTimestamp"] = created
        obj["spec"]["priority"] = priority
        pod = core.parse_pod(obj)
        result = core.Gang(job_id=pod.job_id, namespace="ns", group="")
        result.pods[pod.key] = pod
        return result

    early = gang("z-early", "2026-01-01T00:00:00Z")
    late = gang("a-late", "2026-01-01T00:00:05Z")
    tie = gang("b-tie", "2026-01-01T00:00:00Z")
    urgent = gang("y-urgent", "2026-01-01T00:01:00Z", priority=100)
    unknown = core.Gang(job_id="ns/pod/empty", namespace="ns", group="")  # no pods seen: last
    ordered = sorted([late, unknown, early, tie, urgent], key=core.Gang.submit_order)
    assert [g.job_id for g in ordered] == [
        "ns/pod/y-urgent",
        "ns/pod/b-tie",
        "ns/pod/z-early",
        "ns/pod/a-late",
        "ns/pod/empty",
    ]


def test_bind_request_fields_carry_the_forecasting_features() -> None:
    def pod(name: str, limit: str | None = None, deadline: int | None = None, image: str = "") -> core.Pod:
        obj = pod_object("ns", name, gpus=1, group="g")
        container = obj["spec"]["containers"][0]
        container["command"], container["args"] = ["python", f"{name}.py"], ["--fast"]
        if image:
            container["image"] = image
        if limit is not None:
            obj["metadata"]["annotations"][core.TIME_LIMIT_ANNOTATION] = limit
        if deadline is not None:
            obj["spec"]["activeDeadlineSeconds"] = deadline
        return core.parse_pod(obj)

    gang = core.Gang(job_id="ns/g", namespace="ns", group="g")
    limited = [pod("a", image="registry.example/a:1"), pod("b", limit="2h"), pod("c", limit="1h", deadline=5400)]
    fields = core.bind_request_fields(gang, limited)
    assert fields["image"] == "registry.example/a:1" and fields["command"] == "python a.py --fast"  # the first pod's
    assert fields["time_limit_s"] == 3600.0  # the smallest across the pods that ask for one
    assert core.bind_request_fields(gang, [pod("d", deadline=600), pod("e", limit="1d")])["time_limit_s"] == 600.0
    unlimited = core.bind_request_fields(gang, [pod("f"), pod("g")])
    assert "time_limit_s" not in unlimited  # proto3 optional: unset, not 0
    assert unlimited["image"] == "registry.example/train:1" and unlimited["command"] == "python f.py --fast"


def test_a_late_pod_takes_the_place_of_a_deleted_member_that_asked_the_same() -> None:
    def pod(name: str, gpus: int, node: str = "") -> core.Pod:
        obj = pod_object("ns", name, gpus=gpus, group="g")
        obj["spec"]["nodeName"] = node
        return core.parse_pod(obj)

    members = [pod("w-0", 2, "n1"), pod("w-1", 2, "n2"), pod("w-2", 4, "n3")]
    gang = core.Gang(job_id="ns/g", namespace="ns", group="g", min_member=3, bound=True, generation=1)
    gang.submitted = tuple(member.key for member in members)
    gang.pods = {member.key: member for member in members}
    logged = [member.resources for member in members]
    late = [pod("w-1b", 2), pod("w-2b", 2)]
    assert core.replacements(gang, logged, late) == []  # every member is still there
    del gang.pods[members[1].key]
    del gang.pods[members[2].key]
    # w-1b asks what w-1 asked: its place; w-2b asks 2 GPUs where w-2 asked 4: no place for it
    assert core.replacements(gang, logged, late) == [(1, late[0])]
    twins = [pod("w-1b", 2), pod("w-1c", 2)]
    assert core.replacements(gang, logged, twins) == [(1, twins[0])]  # one place, first come
    assert core.replacements(gang, [logged[0], None, logged[2]], late) == []  # a logged request not readable
