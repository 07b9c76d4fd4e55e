"""gRPC Quota: Admit (owner check, then the transactional decision) and Usage (the ledger over a window)."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from opentelemetry import trace

from kumiki.common.contracts.v1 import quota_pb2, quota_pb2_grpc
from kumiki.common.grpcutil import InvalidRequest, abort_invalid
from kumiki.quota.adapters.auth import Authenticator, Unauthenticated
from kumiki.quota.adapters.convert import admission_response, admit_request, usage_response
from kumiki.quota.adapters.store import NoConfig, NotOwner, QuotaStore, UnknownQueue
from kumiki.quota.core import may_submit, timestamp_micros

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.quota")


class QuotaServicer(quota_pb2_grpc.QuotaServicer):
    def __init__(self, store: QuotaStore, auth: Authenticator, changed: asyncio.Event | None = None) -> None:
        self.store = store
        self.auth = auth
        self.changed = changed  # set when an admission chose reclaim victims, so they are published at once

    async def _identity(self, context: grpc.aio.ServicerContext, queue: str) -> str | None:
        try:
            return self.auth.identity(context)
        except Unauthenticated as error:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"queue {queue}: {error}")
            raise AssertionError("unreachable") from None

    async def Admit(
        self, request: quota_pb2.AdmitRequest, context: grpc.aio.ServicerContext
    ) -> quota_pb2.AdmitResponse:
        try:
            admit = admit_request(request)
        except InvalidRequest as error:
            await abort_invalid(context, error)
        identity = await self._identity(context, request.queue)
        try:
            with tracer.start_as_current_span(
                "admit",
                attributes={"kumiki.job.id": admit.job_id, "kumiki.queue": admit.queue, "kumiki.gpus": admit.gpus},
            ) as span:  # the admission's Postgres transaction, inside Quota.Admit's SERVER span
                result = await self.store.admit(admit, identity)
                span.set_attributes(
                    {
                        "kumiki.quota.admitted": result.admission.admitted,
                        "kumiki.quota.outcome": result.admission.outcome.name.lower(),
                        "kumiki.quota.code": result.admission.code,
                        "kumiki.quota.victims": [victim.job_id for victim in result.victims],
                    }
                )
        except UnknownQueue as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        except NotOwner as error:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(error))
        except NoConfig as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        if self.changed is not None and result.victims:
            self.changed.set()
        if result.victims:
            log.info(
                "reclaim requested",
                extra={"job": admit.job_id, "queue": admit.queue, "victims": [v.job_id for v in result.victims]},
            )
        return admission_response(result.admission)

    async def Usage(
        self, request: quota_pb2.UsageRequest, context: grpc.aio.ServicerContext
    ) -> quota_pb2.UsageResponse:
        since_us = timestamp_micros(request.since.seconds, request.since.nanos) if request.HasField("since") else 0
        now_us = time.time_ns() // 1000
        until_us = timestamp_micros(request.until.seconds, request.until.nanos) if request.HasField("until") else now_us
        for name, micros in (("since", since_us), ("until", until_us)):  # Postgres timestamptz: years 1..9999
            if not 0 <= micros < 253_402_300_800 * 1_000_000:
                await abort_invalid(context, InvalidRequest(name, "must be a time from 1970 to 9999"))
        if until_us <= since_us:
            await abort_invalid(context, InvalidRequest("until", "must be after since"))
        identity = await self._identity(context, request.queue or "(all)")
        try:
            config = await self.store.config()
        except NoConfig as error:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(error))
        if request.queue and request.queue not in config.queues:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"queue: unknown queue {request.queue!r}")
        rows = await self.store.usage(since_us, until_us, now_us, request.queue)
        if identity is not None:  # owners see the queues they may submit to, nothing else
            rows = [row for row in rows if row.queue in config.queues and may_submit(config, identity, row.queue)]
        return usage_response(rows)
