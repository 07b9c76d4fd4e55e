"""Quota's request rules, pure: what makes an Admit request valid."""

from __future__ import annotations

import math

from kumiki.common.contracts.v1 import quota_pb2
from kumiki.common.grpcutil import InvalidRequest


def validate_admit(request: quota_pb2.AdmitRequest) -> None:
    if not request.job.job_id:
        raise InvalidRequest("job.job_id", "required")
    if not request.queue:
        raise InvalidRequest("queue", "required")
    if not math.isfinite(request.gpus) or request.gpus < 0:
        raise InvalidRequest("gpus", f"must be a finite number >= 0, got {request.gpus}")
