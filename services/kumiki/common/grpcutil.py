"""Small helpers for gRPC servicers: field-naming validation errors, timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
from google.protobuf.timestamp_pb2 import Timestamp


class InvalidRequest(ValueError):
    """A request field that is wrong; becomes INVALID_ARGUMENT with 'field: problem'."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


async def abort_invalid(context: grpc.aio.ServicerContext, error: InvalidRequest) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


def timestamp(moment: datetime | None = None) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime((moment or datetime.now(UTC)).astimezone(UTC))
    return stamp
