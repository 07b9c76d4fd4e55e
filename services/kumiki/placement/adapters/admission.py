"""Quota admission as placement sees it: ask the quota service, or allow everything and say so."""

from __future__ import annotations

import logging
from typing import Protocol

import grpc

from kumiki.common.contracts.v1 import common_pb2, quota_pb2, quota_pb2_grpc
from kumiki.common.tracing import ClientTracingInterceptor
from kumiki.placement.core import BindCommand

log = logging.getLogger(__name__)


class Admission(Protocol):
    async def admit(self, command: BindCommand) -> str | None:
        """None when the job may run now; otherwise the reason it may not."""
        ...


class AllowAllAdmission:
    """Used while no quota service is configured (KUMIKI_QUOTA_ADDRESS unset): every job is admitted."""

    def __init__(self) -> None:
        log.warning("quota admission is allow-all: KUMIKI_QUOTA_ADDRESS is not set, no queue limits are enforced")

    async def admit(self, command: BindCommand) -> str | None:
        return None


class QuotaServiceAdmission:
    """Quota.Admit over gRPC; the bearer token (if any) identifies placement to the quota service."""

    def __init__(self, address: str, token: str | None, credentials: grpc.ChannelCredentials | None = None) -> None:
        # a CLIENT span per Admit, a child of the decision's span; it sends its own traceparent to quota
        interceptors = [ClientTracingInterceptor(address, "placement")]
        channel = (
            grpc.aio.secure_channel(address, credentials, interceptors=interceptors)
            if credentials
            else grpc.aio.insecure_channel(address, interceptors=interceptors)
        )
        self.stub = quota_pb2_grpc.QuotaStub(channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()

    async def admit(self, command: BindCommand) -> str | None:
        try:
            reply = await self._admit(command)
        except grpc.aio.AioRpcError as error:  # fail closed: a job the quota service cannot vouch for waits
            return f"quota service answered {error.code().name}: {error.details()}"
        if reply.admitted:
            return None
        return reply.reason.message or reply.reason.code or "denied by quota"

    async def _admit(self, command: BindCommand) -> quota_pb2.AdmitResponse:
        gpu_models = {pod.gpu_model for pod in command.request.pods}
        reply: quota_pb2.AdmitResponse = await self.stub.Admit(
            quota_pb2.AdmitRequest(
                job=common_pb2.JobRef(job_id=command.job_id, generation=command.generation),
                queue=command.queue,
                gpus=command.request.gpu_demand,
                gpu_model=gpu_models.pop() if len(gpu_models) == 1 else "",
                priority_tier=command.priority_tier,
                preemptible=command.preemptible,
            ),
            metadata=self.metadata,
            timeout=2.0,
        )
        return reply
