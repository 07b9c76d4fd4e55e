"""What a fuzzed input's answer must be, and the tally of answers per entry point.

A gRPC answer is one of: OK; INVALID_ARGUMENT whose reason names a field of the request (``pods[0].gpus: ...``)
or says the bytes are undecodable; a domain refusal (NOT_FOUND, FAILED_PRECONDITION, PERMISSION_DENIED,
RESOURCE_EXHAUSTED for a message over the size limit). Anything else (UNKNOWN, INTERNAL: a handler crashed;
DEADLINE_EXCEEDED: it hung) is a finding.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import grpc
from google.protobuf.descriptor import Descriptor

REFUSALS = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[\d+\])*$")


def names_a_field(descriptor: Descriptor, reason: str) -> bool:
    """True when every '; '-separated problem of `reason` starts with a field path of `descriptor`."""
    for problem in reason.split("; "):
        path, sep, _ = problem.partition(": ")
        if not sep:
            return False
        current: Descriptor | None = descriptor
        for segment in path.split("."):
            match = _SEGMENT.match(segment)
            if current is None or match is None or match.group(1) not in current.fields_by_name:
                return False
            current = current.fields_by_name[match.group(1)].message_type
    return True


def classify(descriptor: Descriptor, code: grpc.StatusCode, details: str) -> str:
    """'ok', 'rejected-undecodable', 'rejected-field', 'refused', or a finding: 'crash: ...' / 'hang'."""
    if code == grpc.StatusCode.OK:
        return "ok"
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if details.startswith("request: undecodable"):
            return "rejected-undecodable"
        if names_a_field(descriptor, details):
            return "rejected-field"
        return f"crash: INVALID_ARGUMENT without a field name: {details[:200]}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "hang"
    if code in REFUSALS:
        return "refused"
    return f"crash: {code.name}: {details[:200]}"


@dataclass
class Tally:
    """Outcomes of one entry point."""

    name: str
    outcomes: Counter[str] = field(default_factory=Counter)
    findings: list[tuple[str, bytes]] = field(default_factory=list)

    def add(self, outcome: str, payload: bytes) -> None:
        kind = "crash" if outcome.startswith("crash") else outcome
        self.outcomes[kind] += 1
        if kind in ("crash", "hang") and len(self.findings) < 20:
            self.findings.append((outcome, payload))

    @property
    def tried(self) -> int:
        return sum(self.outcomes.values())


def call(
    channel: grpc.Channel,
    path: str,
    request: Descriptor,
    response: type | None,
    payload: bytes,
    *,
    streaming: bool = False,
    watching: bool = False,
    timeout_s: float = 10.0,
) -> list[str]:
    """Send `payload` as the raw request of `path`; the outcome (one per answer of a stream).

    `streaming`: the client streams (BindStream: the payload is sent twice). `watching`: the server streams
    until the caller leaves (Checkpoints.Watch), so a stream still open at a short deadline is an answer.
    """
    try:
        if watching:
            try:
                for _ in channel.unary_stream(path)(payload, timeout=0.25):
                    pass
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                    return ["ok"]
                raise
            return ["ok"]
        if not streaming:
            channel.unary_unary(path)(payload, timeout=timeout_s)
            return ["ok"]
        outcomes = []
        for answer in channel.stream_stream(path)(iter([payload, payload]), timeout=timeout_s):
            decoded = response.FromString(answer) if response is not None else None
            code = getattr(decoded, "status_code", 0)
            if code:
                status = next((s for s in grpc.StatusCode if s.value[0] == code), grpc.StatusCode.UNKNOWN)
                outcomes.append(classify(request, status, decoded.error))  # type: ignore[union-attr]
            else:
                outcomes.append("ok")
        return outcomes or ["ok"]
    except grpc.RpcError as error:
        return [classify(request, error.code(), error.details() or "")]  # type: ignore[attr-defined]
