"""Every RPC of every gRPC service, fuzzed from outside on loopback: random bytes, byte-mutated valid requests
and valid requests with hostile values, against the services started by the shared shell over Apache Kafka
and Postgres. No UNKNOWN or INTERNAL, no hang; INVALID_ARGUMENT names the field or says the bytes are
undecodable; at most one WARNING line per rejected request and no traceback; health still SERVING after."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2
from hypothesis import HealthCheck, given, settings

from kumiki.common.contracts.v1 import common_pb2, placement_pb2
from tests.fuzz.oracle import Tally, call
from tests.fuzz.services import GRPC_SERVICES, Endpoint, RunningServices, running_services
from tests.fuzz.strategies import payloads

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.postgres,
    # the services' own threads (aiokafka's backoff jitter) use `random` while hypothesis draws: not our strategies
    pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies"),
]
EXAMPLES = int(os.environ.get("KUMIKI_FUZZ_EXAMPLES", "60"))  # per RPC in CI; benchmarks/fuzz_inputs.py runs more
ENDPOINTS = [f"{service.name}.{method.name}" for service in GRPC_SERVICES.values() for method in service.methods]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServices]:
    kafka = os.environ.get("KUMIKI_TEST_KAFKA_BOOTSTRAP")
    database = os.environ.get("KUMIKI_TEST_DATABASE_URL")
    if not kafka or not database:
        pytest.skip("KUMIKI_TEST_KAFKA_BOOTSTRAP and KUMIKI_TEST_DATABASE_URL not set (CI starts both)")
    with running_services(kafka, database, tmp_path_factory.mktemp("fuzz")) as running:
        yield running


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def logged() -> Iterator[list[logging.LogRecord]]:
    handler = _Records()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)


def _endpoint(services: RunningServices, name: str) -> Endpoint:
    return next(endpoint for endpoint in services.endpoints if endpoint.name == name)


def _check_logs(records: list[logging.LogRecord], rejected: int) -> None:
    guard = [r for r in records if r.name == "kumiki.common.grpcutil"]
    assert len(guard) <= rejected, f"{len(guard)} guard lines for {rejected} rejected requests"
    assert all(r.levelno == logging.WARNING for r in guard)
    errors = [f"{r.name}: {r.getMessage()}" for r in records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, f"errors or tracebacks logged: {errors[:5]}"


@pytest.mark.parametrize("name", ENDPOINTS)
def test_every_rpc_answers_fuzzed_requests_or_rejects_them_naming_the_field(
    services: RunningServices, name: str, logged: list[logging.LogRecord]
) -> None:
    endpoint = _endpoint(services, name)
    request = endpoint.method.input_type
    response = GetMessageClass(endpoint.method.output_type)
    tally = Tally(name)

    with grpc.insecure_channel(endpoint.address) as channel:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(payloads(request, oversized=True))
        def one(payload: bytes) -> None:
            for outcome in call(
                channel,
                endpoint.path,
                request,
                response,
                payload,
                streaming=endpoint.streaming,
                watching=endpoint.watching,
            ):
                tally.add(outcome, payload)
                assert not outcome.startswith("crash") and outcome != "hang", f"{outcome} for {payload[:200]!r}"

        one()
    assert tally.outcomes["rejected-undecodable"] > 0, tally.outcomes  # the inputs reached the guard
    assert tally.outcomes["ok"] + tally.outcomes["rejected-field"] + tally.outcomes["refused"] > 0, tally.outcomes
    _check_logs(logged, tally.outcomes["rejected-undecodable"] + tally.outcomes["rejected-field"])
    assert services.health(endpoint.service) == health_pb2.HealthCheckResponse.SERVING


def test_three_thousand_malformed_binds_get_invalid_argument_not_unknown(
    services: RunningServices, logged: list[logging.LogRecord]
) -> None:
    """The report that opened issue 15: 3,000 malformed Placement.Bind payloads (random bytes and byte-mutated
    valid requests) got UNKNOWN and an ERROR traceback each in 2,968 cases."""
    rng = random.Random(15)
    valid = placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="job-1", generation=1),
        queue="team-a",
        pods=[common_pb2.PodResources(gpus=2, gpu_model="A100", cpu_milli=4000, memory_mib=16384)],
    ).SerializeToString()
    codes: dict[str, int] = {}
    details: list[str] = []
    with grpc.insecure_channel(services.address("placement")) as channel:
        bind = channel.unary_unary("/kumiki.v1.Placement/Bind")
        for index in range(3000):
            if index % 2:
                payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
            else:
                buffer = bytearray(valid)
                for _ in range(rng.randrange(1, 4)):
                    buffer[rng.randrange(len(buffer))] = rng.randrange(256)
                payload = bytes(buffer[: rng.randrange(1, len(buffer) + 1)])
            try:
                bind(payload, timeout=10)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as error:
                code = error.code().name  # type: ignore[attr-defined]
                codes[code] = codes.get(code, 0) + 1
                details.append(error.details())  # type: ignore[attr-defined]
    assert "UNKNOWN" not in codes and "INTERNAL" not in codes, codes
    assert codes.get("INVALID_ARGUMENT", 0) > 2500, codes  # a few mutations still decode to valid binds
    undecodable = [d for d in details if d.startswith("request: undecodable as kumiki.v1.BindRequest")]
    assert len(undecodable) > 1000, codes
    _check_logs(logged, len(undecodable))
    assert services.health("placement") == health_pb2.HealthCheckResponse.SERVING


def test_undecodable_message_inside_a_bind_stream_ends_the_stream_with_invalid_argument(
    services: RunningServices, logged: list[logging.LogRecord]
) -> None:
    """A good request is answered, then a corrupt one ends the stream with INVALID_ARGUMENT naming the field."""
    good = placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="stream-job", generation=1), queue="team-a", pods=[common_pb2.PodResources(gpus=1)]
    ).SerializeToString()
    bad = b"\x0a\x05ab"  # field 1 (job) claims 5 bytes, 2 follow
    answers: list[bytes] = []
    with grpc.insecure_channel(services.address("placement")) as channel:
        stream = channel.stream_stream("/kumiki.v1.Placement/BindStream")(iter([good, bad]), timeout=10)
        with pytest.raises(grpc.RpcError) as raised:
            answers.extend(stream)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert raised.value.details() == (  # type: ignore[attr-defined]
        "request: undecodable as kumiki.v1.BindRequest: job: length 5 runs past the end of the message (byte 0)"
    )
    _check_logs(logged, 1)
    assert services.health("placement") == health_pb2.HealthCheckResponse.SERVING


def test_a_flood_of_undecodable_requests_is_logged_within_the_budget(
    services: RunningServices, logged: list[logging.LogRecord]
) -> None:
    """1,000 undecodable requests as fast as one client sends them: every one is rejected, but the log gets
    the burst budget's lines and a count of what it left out, not 1,000 lines."""
    with grpc.insecure_channel(services.address("quota")) as channel:
        admit = channel.unary_unary("/kumiki.v1.Quota/Admit")
        for _ in range(1000):
            with pytest.raises(grpc.RpcError) as raised:
                admit(b"\xff\xff\xff\xff", timeout=10)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    lines = [r for r in logged if r.name == "kumiki.common.grpcutil"]
    assert 1 <= len(lines) < 500, len(lines)


def test_rejected_requests_are_counted_by_method(services: RunningServices) -> None:
    from prometheus_client import REGISTRY

    before = REGISTRY.get_sample_value(
        "kumiki_grpc_rejected_requests_total", {"method": "/kumiki.v1.Checkpoints/Report"}
    )
    with grpc.insecure_channel(services.address("preemption")) as channel, pytest.raises(grpc.RpcError):
        channel.unary_unary("/kumiki.v1.Checkpoints/Report")(b"\x0a\xff", timeout=10)
    after = REGISTRY.get_sample_value(
        "kumiki_grpc_rejected_requests_total", {"method": "/kumiki.v1.Checkpoints/Report"}
    )
    assert (after or 0) - (before or 0) == 1


def test_what_the_long_run_found_stays_fixed(services: RunningServices) -> None:
    """benchmarks/fuzz_inputs.py findings: 2**64 - 1 MiB of GPU memory got UNAVAILABLE from placement (it did not
    fit the event's uint64 once rounded back); a generation or step past int64 got UNKNOWN from Postgres."""
    from kumiki.common.contracts.v1 import checkpoints_pb2

    huge = placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="huge", generation=1),
        queue="team-a",
        pods=[common_pb2.PodResources(gpu_memory_mib=2**64 - 1, memory_mib=2)],
    )
    report = checkpoints_pb2.CheckpointReport(
        job=common_pb2.JobRef(job_id="j", generation=1), uri="s3://b/k", step=2**64 - 1
    )
    report.completed_at.seconds = 1_700_000_000
    cases = [
        ("placement", "/kumiki.v1.Placement/Bind", huge, "pods[0].gpu_memory_mib: must be <= 2**53"),
        ("preemption", "/kumiki.v1.Checkpoints/Report", report, "step: must be <= 9223372036854775807"),
    ]
    for service, path, request, reason in cases:
        with grpc.insecure_channel(services.address(service)) as channel, pytest.raises(grpc.RpcError) as raised:
            channel.unary_unary(path)(request.SerializeToString(), timeout=10)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert reason in raised.value.details()  # type: ignore[attr-defined]
