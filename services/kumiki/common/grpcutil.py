"""Small helpers for gRPC servicers: field-naming validation errors, timestamps."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp


class InvalidRequest(ValueError):
    """A request field that is wrong; becomes INVALID_ARGUMENT with 'field: problem'."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


def require_job(job: Any, *, generation: bool = True) -> None:
    """A request's JobRef: an id, and (unless `generation` is False) a generation from 1 on."""
    if not job.job_id:
        raise InvalidRequest("job.job_id", "required")
    if generation and job.generation < 1:
        raise InvalidRequest("job.generation", "must be >= 1")


async def abort_invalid(context: grpc.aio.ServicerContext, error: InvalidRequest) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))


def timestamp(moment: datetime | None = None) -> Timestamp:
    if moment is None:  # the hot path (every published decision): no datetime round trip
        seconds, nanos = divmod(time.time_ns(), 1_000_000_000)
        return Timestamp(seconds=seconds, nanos=nanos)
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp
