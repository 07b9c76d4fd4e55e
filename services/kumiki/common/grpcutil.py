"""Small helpers for gRPC servicers: field-naming validation errors, timestamps, and the guard that turns
requests which do not decode into INVALID_ARGUMENT (every service's server installs it)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import Counter

from kumiki.common.db import UNREACHABLE
from kumiki.common.metrics import labelled

log = logging.getLogger(__name__)


class InvalidRequest(ValueError):
    """A request field that is wrong; becomes INVALID_ARGUMENT with 'field: problem'."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def require_finite(field: str, value: float, *, positive: bool = False) -> float:
    """A number field that must be finite and >= 0 (> 0 when `positive`); returns it."""
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InvalidRequest(field, f"must be a finite number {'>' if positive else '>='} 0, got {value}")
    return value


# An image name or a command line is a forecasting key, not a payload: longer ones are refused
MAX_FEATURE_CHARS = 4096


def job_feature_fields(message: Any) -> tuple[str, str, float | None]:
    """The forecasting features a request or event carries (`image`, `command`, `time_limit_s`), validated:
    InvalidRequest names the field that is too long or a time limit that is not a finite number > 0."""
    for field in ("image", "command"):
        text = getattr(message, field)
        if len(text) > MAX_FEATURE_CHARS:
            raise InvalidRequest(field, f"must be at most {MAX_FEATURE_CHARS} characters, got {len(text)}")
    limit = message.time_limit_s if message.HasField("time_limit_s") else None
    if limit is not None:
        require_finite("time_limit_s", limit, positive=True)
    return message.image, message.command, limit


MAX_INT64 = 2**63 - 1  # the largest count Postgres (bigint) and Kafka keep: a uint64 past it is refused


def require_job(job: Any, *, generation: bool = True) -> None:
    """A request's JobRef: an id, and (unless `generation` is False) a generation from 1 on."""
    if not job.job_id:
        raise InvalidRequest("job.job_id", "required")
    if generation and job.generation < 1:
        raise InvalidRequest("job.generation", "must be >= 1")
    if job.generation > MAX_INT64:
        raise InvalidRequest("job.generation", f"must be <= {MAX_INT64}, got {job.generation}")


async def abort_invalid(context: grpc.aio.ServicerContext, error: InvalidRequest) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


def unix_seconds(stamp: Timestamp) -> float:
    """A protobuf Timestamp as Unix seconds (float)."""
    return float(stamp.seconds + stamp.nanos / 1e9)


def timestamp(moment: datetime | None = None) -> Timestamp:
    if moment is None:  # the hot path (every published decision): no datetime round trip
        seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
        return Timestamp(seconds=seconds, nanos=nanos)
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp


# ---- requests that do not decode -------------------------------------------------------------------
# gRPC's own handling of a request whose bytes do not parse is an UNKNOWN status and a full traceback logged at
# ERROR, for every such request: a caller could fill the disk with them. RequestGuard, installed by the shared
# server setup (kumiki.common.service) on every service, makes it INVALID_ARGUMENT saying what did not decode
# (naming the field where the wire format allows), one WARNING line at most per rejected request. A string
# holding U+0000 is refused there too, naming the field: Postgres cannot store it, so without this check every
# service that writes a request's names would answer it with an UNKNOWN database error.

REJECTED = Counter(
    "kumiki_grpc_rejected_requests_total",
    "gRPC requests rejected before the handler: bytes that do not decode as the method's request, or a NUL in a string",
    ["method"],
)
UNAVAILABLE = Counter(
    "kumiki_grpc_unavailable_total",
    "gRPC calls answered UNAVAILABLE because the handler lost its database (callers retry)",
    ["method"],
)
_MAX_DEPTH = 100  # protobuf's own recursion limit


class Undecodable:
    """What a guarded deserializer returns for bytes that do not parse: the handler is never called with it."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class UndecodableInStream(Exception):
    """Raised by a guarded request stream at bytes that do not parse. The call is aborted by the handler's own task
    once this reaches it, not where the stream is read: a handler may read its requests in another task (BindStream
    does), and an abort there, while the handler writes an answer, is refused by gRPC core (too many operations)
    and leaves the caller waiting for its deadline."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _WireError(Exception):
    pass


def _varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise _WireError(f"{what}: truncated at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise _WireError(f"{what}: a varint longer than 10 bytes at byte {pos}")


def _walk(descriptor: Descriptor, data: bytes, path: str, depth: int) -> None:
    """Raise _WireError naming the first field whose encoding is wrong (protobuf's DecodeError names none)."""
    if depth > _MAX_DEPTH:
        raise _WireError(f"{path or 'request'}: nested deeper than {_MAX_DEPTH} messages")
    seen: dict[int, int] = {}
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos, f"{path or 'request'}: a field tag")
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise _WireError(f"{path or 'request'}: field number 0 at byte {start}")
        field = descriptor.fields_by_number.get(number)
        name = field.name if field is not None else f"#{number} (unknown field)"
        if field is not None and field.is_repeated:
            name = f"{name}[{seen.get(number, 0)}]"
            seen[number] = seen.get(number, 0) + 1
        where = f"{path}.{name}" if path else name
        if wire_type == 0:
            _, pos = _varint(data, pos, where)
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
            if pos > len(data):
                raise _WireError(f"{where}: truncated fixed-width value at byte {start}")
        elif wire_type == 2:
            length, pos = _varint(data, pos, f"{where}: the length")
            if pos + length > len(data):
                raise _WireError(f"{where}: length {length} runs past the end of the message (byte {start})")
            chunk = data[pos : pos + length]
            pos += length
            if field is None:
                continue
            if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
                _walk(field.message_type, chunk, where, depth + 1)
            elif field.type == FieldDescriptor.TYPE_STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError:
                    raise _WireError(f"{where}: not valid UTF-8") from None
        elif wire_type in (3, 4):
            raise _WireError(f"{where}: group encoding (wire type {wire_type}) is not used by any Kumiki message")
        else:
            raise _WireError(f"{where}: invalid wire type {wire_type} at byte {start}")


def undecodable_reason(descriptor: Descriptor, data: bytes) -> str:
    """'request: undecodable as <type>: <field>: <problem>' for bytes that protobuf refused to parse."""
    head = f"request: undecodable as {descriptor.full_name}"
    try:
        _walk(descriptor, data, "", 0)
    except _WireError as error:
        return f"{head}: {error}"
    except Exception:  # the walker must never be what fails: say what protobuf said
        pass
    return f"{head}: wire format corrupt"


def nul_field(message: Message, path: str = "") -> str | None:
    """The first string field holding U+0000 (Postgres text cannot store it; no Kubernetes name has it)."""
    for field, value in message.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        items = value if field.is_repeated else [value]
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            # the map's own field names the problem: a key is no field path (it may hold '.', '; ' or NUL)
            items = list(value.items()) if hasattr(value, "items") else []
            for key, item in items:
                if (isinstance(key, str) and "\x00" in key) or (isinstance(item, str) and "\x00" in item):
                    return where
                if isinstance(item, Message) and (found := nul_field(item, where)) is not None:
                    return found
            continue
        for index, item in enumerate(items):
            at = f"{where}[{index}]" if field.is_repeated else where
            if isinstance(item, str) and "\x00" in item:
                return at
            if isinstance(item, Message) and (found := nul_field(item, at)) is not None:
                return found
    return None


def guarded_deserializer(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """`deserializer` (a generated Message.FromString) that returns Undecodable instead of raising."""
    message_type = getattr(deserializer, "__self__", None)
    descriptor: Descriptor | None = getattr(message_type, "DESCRIPTOR", None)

    def deserialize(data: bytes) -> Any:
        try:
            message = deserializer(data)
            if b"\x00" in data and isinstance(message, Message):  # only then can a string hold a NUL
                where = nul_field(message)
                if where is not None:
                    return Undecodable(f"{where}: contains a NUL character (U+0000), which no Kumiki name may hold")
            return message
        except Exception as error:  # DecodeError, and whatever else a deserializer raises on hostile bytes
            if descriptor is not None and isinstance(error, DecodeError):
                return Undecodable(undecodable_reason(descriptor, data))
            return Undecodable(f"request: undecodable ({type(error).__name__}: {str(error)[:200]})")

    return deserialize


class LogBudget:
    """At most `rate` lines a second (burst `burst`) per process: past it, lines are counted, not written, and the
    next line written says how many were left out. Rejections are still counted in REJECTED either way."""

    def __init__(self, rate: float = 10.0, burst: float = 50.0) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = time.monotonic()
        self.suppressed = 0

    def take(self) -> int | None:
        """None: do not log; otherwise the count of lines left out since the last one."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            self.suppressed += 1
            return None
        self.tokens -= 1.0
        left_out, self.suppressed = self.suppressed, 0
        return left_out


class RequestGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Every method's request deserializer guarded: undecodable bytes end the call with INVALID_ARGUMENT. A
    handler that loses its database (a Postgres restart) ends the call with UNAVAILABLE, which callers retry,
    instead of UNKNOWN with the exception's text."""

    def __init__(self, service: str, budget: LogBudget | None = None) -> None:
        self.service = service
        self.budget = budget or LogBudget()

    async def _reject(self, method: str, context: grpc.aio.ServicerContext, reason: str) -> None:
        labelled(REJECTED, method).inc()
        left_out = self.budget.take()
        if left_out is not None:
            extra: dict[str, object] = {"method": method, "peer": context.peer(), "reason": reason}
            if left_out:
                extra["not_logged_since_last"] = left_out
            log.warning("rejected request before its handler", extra=extra)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)

    async def _unavailable(self, method: str, context: grpc.aio.ServicerContext, error: Exception) -> None:
        labelled(UNAVAILABLE, method).inc()
        if self.budget.take() is not None:
            log.warning("database unavailable; call refused", extra={"method": method, "error": repr(error)})
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the database is unavailable; retry")

    async def intercept_service(self, continuation, handler_call_details):  # type: ignore[no-untyped-def]
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        deserializer = guarded_deserializer(handler.request_deserializer)
        reject, unavailable = self._reject, self._unavailable
        serializer = handler.response_serializer

        async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    raise UndecodableInStream(request.reason)
                yield request

        if handler.unary_unary is not None:
            unary_unary = handler.unary_unary

            async def guarded_unary_unary(request, context):  # type: ignore[no-untyped-def]
                if isinstance(request, Undecodable):
                    await reject(method, context, request.reason)
                try:
                    return await unary_unary(request, context)
                except UNREACHABLE as error:
                    await unavailable(method, context, error)

            return grpc.unary_unary_rpc_method_handler(guarded_unary_unary, deserializer, serializer)
        if handler.unary_stream is not None:
            unary_stream = handler.unary_stream

            async def guarded_unary_stream(request, context):  # type: ignore[no-untyped-def]
                if isinstance(request, Undecodable):
                    await reject(method, context, request.reason)
                try:
                    async for response in unary_stream(request, context):
                        yield response
                except UNREACHABLE as error:
                    await unavailable(method, context, error)

            return grpc.unary_stream_rpc_method_handler(guarded_unary_stream, deserializer, serializer)
        if handler.stream_unary is not None:
            stream_unary = handler.stream_unary

            async def guarded_stream_unary(requests, context):  # type: ignore[no-untyped-def]
                try:
                    return await stream_unary(checked(requests), context)
                except UndecodableInStream as undecodable:
                    await reject(method, context, undecodable.reason)

            return grpc.stream_unary_rpc_method_handler(guarded_stream_unary, deserializer, serializer)
        stream_stream = handler.stream_stream

        async def guarded_stream_stream(requests, context):  # type: ignore[no-untyped-def]
            try:
                async for response in stream_stream(checked(requests), context):
                    yield response
            except UndecodableInStream as undecodable:
                await reject(method, context, undecodable.reason)

        return grpc.stream_stream_rpc_method_handler(guarded_stream_stream, deserializer, serializer)


# ---- calling another Kumiki service ----------------------------------------------------------------------
def channel_credentials(
    env: Mapping[str, str], prefix: str, *, ca_required: bool = False
) -> grpc.ChannelCredentials | None:
    """TLS to a server from `{prefix}_CAFILE` (the CA that signed its certificate; unset: the system's roots) and,
    for mTLS, `{prefix}_CERTFILE` with `{prefix}_KEYFILE` (this process's identity). None when neither a CA nor
    a certificate is set: plaintext. `ca_required`: a certificate without the CA is refused."""
    from kumiki.common.config import ConfigError, env_file

    cafile = env_file(env, f"{prefix}_CAFILE")
    certfile = env_file(env, f"{prefix}_CERTFILE")
    keyfile = env_file(env, f"{prefix}_KEYFILE")
    if (certfile is None) != (keyfile is None):
        raise ConfigError(f"{prefix}_KEYFILE: {prefix}_CERTFILE and {prefix}_KEYFILE must be set together")
    if cafile is None and certfile is not None and ca_required:
        raise ConfigError(f"{prefix}_CAFILE: required with {prefix}_CERTFILE (the servers' CA)")
    if cafile is None and certfile is None:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=cafile.read_bytes() if cafile else None,
        private_key=keyfile.read_bytes() if keyfile else None,
        certificate_chain=certfile.read_bytes() if certfile else None,
    )


def client_credentials(env: Mapping[str, str]) -> grpc.ChannelCredentials | None:
    """How this process calls other Kumiki services: KUMIKI_GRPC_CAFILE (the CA that signed their certificates)
    and, for mTLS, KUMIKI_GRPC_CERTFILE and KUMIKI_GRPC_KEYFILE (this process's identity: the certificate's CN).
    None when KUMIKI_GRPC_CAFILE is unset: plaintext, as a development stack without --tls runs."""
    return channel_credentials(env, "KUMIKI_GRPC", ca_required=True)


def client_channel(
    address: str, env: Mapping[str, str] | None = None, interceptors: Sequence[Any] = ()
) -> grpc.aio.Channel:
    """An asyncio channel to another Kumiki service: TLS/mTLS per `client_credentials`, plaintext otherwise."""
    import os

    credentials = client_credentials(os.environ if env is None else env)
    if credentials is None:
        return grpc.aio.insecure_channel(address, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, interceptors=interceptors)
