"""`kumiki cluster emulate` (publish an emulated cluster) and `kumiki placement bind|release|explain`."""

from __future__ import annotations

import argparse
import asyncio
import json
import os

import grpc
from google.protobuf.json_format import MessageToDict

from kumiki.cli.main import UsageError, message_console
from kumiki.common.config import ConfigError, KafkaSettings
from kumiki.common.contracts.v1 import common_pb2, events_pb2, placement_pb2, placement_pb2_grpc
from kumiki.common.grpcutil import client_channel
from kumiki.devstack.cluster import emulated_nodes, publish_nodes
from kumiki.devstack.stack import local_bootstrap, service_address

console = message_console()


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected >= 1, got {number}")
    return number


# `kumiki placement release --outcome`: how the job ended
OUTCOMES = {
    "released": events_pb2.JOB_STATE_RELEASED,
    "completed": events_pb2.JOB_STATE_COMPLETED,
    "failed": events_pb2.JOB_STATE_FAILED,
}


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    cluster = subparsers.add_parser("cluster", help="cluster state tools")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    emulate = cluster_commands.add_parser("emulate", help="publish emulated nodes on kumiki.cluster.state")
    emulate.add_argument("--nodes", type=_positive, default=4, help="how many nodes (mixed A100/H100/V100/MIG shapes)")
    emulate.add_argument("--prefix", default="node", help="node name prefix")
    emulate.set_defaults(handler=_emulate)

    placement = subparsers.add_parser("placement", help="talk to the placement service")
    placement.add_argument(
        "--address",
        default=None,
        help="host:port of Placement (default $KUMIKI_PLACEMENT_ADDRESS, else the local stack's, else 127.0.0.1:50051)",
    )
    commands = placement.add_subparsers(dest="placement_command", required=True)
    bind = commands.add_parser("bind", help="bind a gang of identical pods")
    bind.add_argument("job_id")
    bind.add_argument("--queue", required=True)
    bind.add_argument("--pods", type=_positive, default=1)
    bind.add_argument("--gpus", type=int, default=1, help="whole GPUs per pod")
    bind.add_argument("--generation", type=_positive, default=1)
    bind.set_defaults(handler=_bind)
    release = commands.add_parser("release", help="free a job's allocation")
    release.add_argument("job_id")
    release.add_argument("--generation", type=int, default=0, help="0 = whatever generation holds it")
    release.add_argument(
        "--outcome",
        choices=tuple(OUTCOMES),
        default="released",
        help="how the job ended: completed and failed publish that state with the run time (forecasts learn it)",
    )
    release.add_argument("--reason", default="", help="free-form reason recorded with the release")
    release.set_defaults(handler=_release)
    explain = commands.add_parser("explain", help="why is a job waiting (or where it runs)")
    explain.add_argument("job_id")
    explain.set_defaults(handler=_explain)


def _emulate(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if not env.get("KUMIKI_KAFKA_BOOTSTRAP") and local_bootstrap():  # the broker `kumiki up` started
        env["KUMIKI_KAFKA_BOOTSTRAP"] = str(local_bootstrap())
    try:
        kafka = KafkaSettings.from_env(env)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    count = asyncio.run(publish_nodes(kafka, emulated_nodes(args.nodes, prefix=args.prefix)))
    console.print(f"published {count} emulated nodes to {kafka.topic_prefix}cluster.state on {kafka.bootstrap}")
    return 0


def _stack_jaeger() -> str | None:
    """The local stack's Jaeger (`kumiki up --observability`), when it runs."""
    from kumiki.devstack.observability import observability_state
    from kumiki.devstack.stack import stack_home

    running = observability_state(stack_home() / "observability")
    return f"http://127.0.0.1:{running['jaeger']['otlp_grpc_port']}" if running else None


async def _call(address: str, method: str, request: object) -> object:
    """Traced when OTEL_EXPORTER_OTLP_ENDPOINT is set or the local stack's Jaeger runs: the CLI's span is the
    root of the decision's trace (`kumiki trace JOB` shows it), sampled by OTEL_TRACES_SAMPLER like the services."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _stack_jaeger()
    if not endpoint:
        async with client_channel(address) as channel:
            return await getattr(placement_pb2_grpc.PlacementStub(channel), method)(request, timeout=10)
    from opentelemetry import trace

    from kumiki.common.tracing import ClientTracingInterceptor, configure_tracing, sampler_from_env, shutdown_tracing

    try:
        configure_tracing("cli", endpoint, sampler=sampler_from_env(os.environ))
    except ConfigError as error:
        raise UsageError(str(error)) from None
    try:
        with trace.get_tracer("kumiki.cli").start_as_current_span(f"kumiki placement {method.lower()}"):
            interceptors = [ClientTracingInterceptor(address, "cli")]
            async with client_channel(address, interceptors=interceptors) as channel:
                return await getattr(placement_pb2_grpc.PlacementStub(channel), method)(request, timeout=10)
    finally:
        shutdown_tracing()  # the process ends right after: send its spans now


def placement_address(given: str | None) -> str:
    """--address, else KUMIKI_PLACEMENT_ADDRESS, else the placement `kumiki up` started, else its default port."""
    return given or os.environ.get("KUMIKI_PLACEMENT_ADDRESS") or service_address("placement") or "127.0.0.1:50051"


def _run(given: str | None, method: str, request: object) -> int:
    address = placement_address(given)
    if ":" not in address:
        raise UsageError(f"--address: expected host:port, got {address!r}")
    try:
        reply = asyncio.run(_call(address, method, request))
    except grpc.aio.AioRpcError as error:
        console.print(f"{method}: {error.code().name}: {error.details()}", style="red", markup=False)
        return 1
    print(json.dumps(MessageToDict(reply, preserving_proto_field_name=True), indent=2))  # type: ignore[arg-type]
    return 0


def _bind(args: argparse.Namespace) -> int:
    if not 0 <= args.gpus <= 64:
        raise UsageError(f"--gpus: expected 0..64, got {args.gpus}")
    request = placement_pb2.BindRequest(
        job=common_pb2.JobRef(job_id=args.job_id, generation=args.generation),
        queue=args.queue,
        pods=[common_pb2.PodResources(gpus=args.gpus) for _ in range(args.pods)],
    )
    return _run(args.address, "Bind", request)


def _release(args: argparse.Namespace) -> int:
    request = placement_pb2.ReleaseRequest(
        job=common_pb2.JobRef(job_id=args.job_id, generation=args.generation),
        reason=args.reason or args.outcome,
        final_state=OUTCOMES[args.outcome],
    )
    return _run(args.address, "Release", request)


def _explain(args: argparse.Namespace) -> int:
    return _run(args.address, "Explain", placement_pb2.ExplainRequest(job_id=args.job_id))
