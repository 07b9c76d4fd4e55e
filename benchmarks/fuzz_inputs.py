"""The long fuzzing run: every way into Kumiki, at least 100,000 hostile inputs, counted by outcome.

    python benchmarks/fuzz_inputs.py --bootstrap HOST:PORT --database-url postgresql://... [--inputs 100000]

Entry points are the CI suite's (tests/fuzz): every RPC of the four gRPC services, started by the shared shell
on loopback over Apache Kafka and Postgres; each topic's event decoder; trace, queue, token and environment
configuration; the agent's recordings; DCGM exporter pages. Inputs come from the same hypothesis strategies,
built from the proto descriptors. Per entry point it prints inputs tried, accepted, rejected naming a field,
rejected as undecodable, refused by a domain rule, crashes and hangs, then the log lines and health afterwards.

The baseline, in the same process: --baseline malformed Placement.Bind payloads sent to a placement service
started without the request guard (what every service ran before issue 15), against the same with it.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table

from kumiki.common.contracts.v1 import common_pb2, placement_pb2
from tests.fuzz.entry_points import entry_points
from tests.fuzz.oracle import Tally, call
from tests.fuzz.services import running_services
from tests.fuzz.strategies import payloads

console = Console(width=160)
HANG_S = 2.0
GRPC_VARIANTS = 3  # inputs per hypothesis draw: a call costs more than a draw
PURE_VARIANTS = 10  # a pure entry point costs far less than a draw
KINDS = ("ok", "accepted", "rejected-field", "rejected-undecodable", "refused", "crash", "hang")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.guard = self.errors = self.tracebacks = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.guard += record.name == "kumiki.common.grpcutil"
        self.errors += record.levelno >= logging.ERROR
        self.tracebacks += record.exc_info is not None


def _run(strategy, tally: Tally, inputs: int, one, variants: int) -> None:  # type: ignore[no-untyped-def]
    """Hypothesis draws until `inputs` inputs were tried; each draw is tried as drawn and as `variants` - 1 cheap
    byte-level variants of it (seeded by a drawn integer), which keeps the engine's cost per input small."""

    @settings(
        max_examples=-(-inputs // variants),
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy, st.integers(0, 2**32 - 1))
    def body(value, seed: int) -> None:  # type: ignore[no-untyped-def]
        rng = random.Random(seed)  # drawn up front: the body draws nothing from hypothesis, whatever it does
        for index in range(variants):
            if tally.tried >= inputs:
                return
            one(value if index == 0 else vary(value, rng))

    body()


def vary(value, rng: random.Random):  # type: ignore[no-untyped-def]
    """A damaged copy: bytes are truncated or bit-flipped, text gets a byte flipped, tuples one member varied,
    anything else is tried again as it is (its strategy's own draws already vary its structure)."""
    if isinstance(value, bytes):
        buffer = bytearray(value)
        if not buffer:
            return bytes([rng.randrange(256)])
        if rng.random() < 0.3:
            return bytes(buffer[: rng.randrange(len(buffer))])
        for _ in range(rng.randrange(1, 4)):
            buffer[rng.randrange(len(buffer))] ^= 1 << rng.randrange(8)
        return bytes(buffer)
    if isinstance(value, str):
        return vary(value.encode(), rng).decode("utf-8", "replace")
    if isinstance(value, tuple) and value:
        at = rng.randrange(len(value))
        return (*value[:at], vary(value[at], rng), *value[at + 1 :])
    return value


def fuzz_grpc(running, inputs: int) -> list[Tally]:  # type: ignore[no-untyped-def]
    tallies = []
    for endpoint in running.endpoints:
        tally = Tally(endpoint.name)
        request = endpoint.method.input_type
        response = GetMessageClass(endpoint.method.output_type)
        with grpc.insecure_channel(endpoint.address) as channel:

            def one(payload: bytes, channel=channel, endpoint=endpoint, tally=tally, response=response) -> None:  # type: ignore[no-untyped-def]
                for outcome in call(
                    channel, endpoint.path, endpoint.method.input_type, response, payload,
                    streaming=endpoint.streaming, watching=endpoint.watching,
                ):  # fmt: skip
                    tally.add(outcome, payload)

            started = time.perf_counter()
            _run(payloads(request, oversized=True), tally, inputs, one, GRPC_VARIANTS)
        tallies.append(tally)
        console.print(
            f"  {tally.name}: {tally.tried} inputs in {time.perf_counter() - started:.1f} s, {dict(tally.outcomes)}"
        )
    return tallies


def fuzz_pure(inputs: int) -> list[Tally]:
    tallies = []
    for point in entry_points():
        tally = Tally(point.name)

        def one(value, point=point, tally=tally) -> None:  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            outcome = point.run(value)
            tally.add("hang" if time.perf_counter() - started > HANG_S else outcome, repr(value)[:300].encode())

        began = time.perf_counter()
        _run(point.inputs, tally, inputs, one, PURE_VARIANTS)
        tallies.append(tally)
        console.print(
            f"  {tally.name}: {tally.tried} inputs in {time.perf_counter() - began:.1f} s, {dict(tally.outcomes)}"
        )
    return tallies


def malformed_binds(count: int, seed: int = 15) -> list[bytes]:
    """The issue's report: random bytes and byte-mutated valid Bind requests, half and half."""
    rng = random.Random(seed)
    valid = placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id="job-1", generation=1),
        queue="team-a",
        pods=[common_pb2.PodResources(gpus=2, gpu_model="A100", cpu_milli=4000, memory_mib=16384)],
    ).SerializeToString()
    out = []
    for index in range(count):
        if index % 2:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
        else:
            buffer = bytearray(valid)
            for _ in range(rng.randrange(1, 4)):
                buffer[rng.randrange(len(buffer))] = rng.randrange(256)
            out.append(bytes(buffer[: rng.randrange(1, len(buffer) + 1)]))
    return out


def baseline(bootstrap: str, database_url: str, count: int, guarded: bool) -> tuple[dict[str, int], Lines]:
    """`count` malformed binds against placement with the guard (today) or without it (before)."""
    lines = Lines()
    logging.getLogger().addHandler(lines)
    codes: dict[str, int] = {}
    patch = mock.patch("kumiki.common.service.RequestGuard", PassThrough) if not guarded else mock.patch.object(
        logging, "raiseExceptions", logging.raiseExceptions
    )  # fmt: skip
    try:
        with patch, running_services(bootstrap, database_url, Path(tempfile.mkdtemp()), ("placement",)) as running:
            with grpc.insecure_channel(running.address("placement")) as channel:
                bind = channel.unary_unary("/kumiki.v1.Placement/Bind")
                for payload in malformed_binds(count):
                    try:
                        bind(payload, timeout=10)
                        codes["OK"] = codes.get("OK", 0) + 1
                    except grpc.RpcError as error:
                        name = error.code().name  # type: ignore[attr-defined]
                        codes[name] = codes.get(name, 0) + 1
            codes["health SERVING"] = int(running.health("placement") == 1)
    finally:
        logging.getLogger().removeHandler(lines)
    return codes, lines


class PassThrough(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """The server setup before the guard: handlers as the generated code registers them."""

    def __init__(self, service: str) -> None:
        pass

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        return await continuation(handler_call_details)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True, help="Apache Kafka bootstrap host:port")
    parser.add_argument("--database-url", required=True, help="Postgres URL of a role that may create databases")
    parser.add_argument("--inputs", type=int, default=100_000, help="total inputs over all entry points (>= 1)")
    parser.add_argument("--baseline", type=int, default=3000, help="malformed binds for the before/after (0: skip)")
    args = parser.parse_args()
    if args.inputs < 1:
        parser.error("--inputs: expected >= 1")
    # the services' own threads (aiokafka's backoff jitter) use `random` while hypothesis draws
    warnings.filterwarnings("ignore", message="Do not use the `random` module inside strategies")
    logging.basicConfig(level=logging.WARNING, stream=open("/dev/null", "w"))  # noqa: SIM115 - lines are counted
    for noisy in ("aiokafka", "kafka", "grpc"):  # they are counted by Lines only at WARNING and above
        logging.getLogger(noisy).setLevel(logging.WARNING)

    if args.baseline:
        console.print(
            f"[bold]baseline[/]: {args.baseline} malformed Placement.Bind payloads, without and with the guard"
        )
        before, before_lines = baseline(args.bootstrap, args.database_url, args.baseline, guarded=False)
        after, after_lines = baseline(args.bootstrap, args.database_url, args.baseline, guarded=True)
        table = Table("server", "status codes", "guard WARNING lines", "ERROR lines", "tracebacks")
        table.add_row("without the guard (before)", str(before), str(before_lines.guard), str(before_lines.errors),
                      str(before_lines.tracebacks))  # fmt: skip
        table.add_row("with the guard (now)", str(after), str(after_lines.guard), str(after_lines.errors),
                      str(after_lines.tracebacks))  # fmt: skip
        console.print(table)
        unknown_before = before.get("UNKNOWN", 0)
        console.print(
            f"UNKNOWN answers: {unknown_before} -> {after.get('UNKNOWN', 0)}; ERROR lines with a traceback:"
            f" {before_lines.tracebacks} -> {after_lines.tracebacks}"
        )

    points = len(entry_points())
    lines = Lines()
    logging.getLogger().addHandler(lines)
    with running_services(args.bootstrap, args.database_url, Path(tempfile.mkdtemp())) as running:
        per_point = -(-args.inputs // (points + len(running.endpoints)))
        console.print(
            f"[bold]fuzzing[/]: {points + len(running.endpoints)} entry points, up to {per_point} inputs each"
        )
        started = time.perf_counter()
        tallies = fuzz_grpc(running, per_point)
        health = {service: running.health(service) == 1 for service in running.hosts}
        tallies += fuzz_pure(per_point)
        elapsed = time.perf_counter() - started
    logging.getLogger().removeHandler(lines)

    table = Table("entry point", "inputs", *KINDS, title="inputs per entry point (hypothesis strategies)")
    totals: dict[str, int] = dict.fromkeys(KINDS, 0)
    for tally in tallies:
        table.add_row(tally.name, f"{tally.tried:,}", *(f"{tally.outcomes[kind]:,}" for kind in KINDS))
        for kind in KINDS:
            totals[kind] += tally.outcomes[kind]
    tried = sum(t.tried for t in tallies)
    table.add_row("[bold]total", f"[bold]{tried:,}", *(f"[bold]{totals[kind]:,}" for kind in KINDS))
    console.print(table)
    rejected = totals["rejected-field"] + totals["rejected-undecodable"]
    console.print(
        f"{tried:,} inputs in {elapsed:.0f} s; crashes {totals['crash']}, hangs {totals['hang']}; rejected {rejected:,}"
        f" ({totals['rejected-field']:,} naming a field, {totals['rejected-undecodable']:,} undecodable);"
        f" guard WARNING lines {lines.guard:,} (<= one per rejected gRPC request), ERROR lines {lines.errors},"
        f" tracebacks {lines.tracebacks}; health after: {health}"
    )
    for tally in tallies:
        for outcome, payload in tally.findings[:3]:
            console.print(f"[red]finding[/] {tally.name}: {outcome} for {payload[:200]!r}")
    return 0 if totals["crash"] == 0 and totals["hang"] == 0 and all(health.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
