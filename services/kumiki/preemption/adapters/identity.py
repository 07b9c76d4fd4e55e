"""Whose checkpoint is it: the Checkpoints service takes a job's reports (and its commands and resume point) only
from that job's own identity, so one job cannot claim a checkpoint for another, ack a preemption it was not
sent, or read where another job resumes.

A job proves who it is with either
- a per-job token, `authorization: Bearer <token>` where the token is HMAC-SHA256(key, job id) in hex: whoever
  launches the job (the binder, a job controller, `kumiki.preemption.adapters.identity.job_token`) hands it the
  token (KUMIKI_JOB_TOKEN; the SDK sends it). The service keeps only the key (KUMIKI_CHECKPOINTS_JOB_KEY_FILE,
  a file of at least 32 bytes), no per-job state; or
- an mTLS client certificate whose common name is `job:<job id>`; or
- the pod's own projected ServiceAccount token, reviewed by the Kubernetes API, when
  KUMIKI_CHECKPOINTS_KUBE_AUDIENCE names the audience pods mount it for (kumiki.preemption.adapters.kube_identity:
  nothing to hand out, no shared key).

Off unless KUMIKI_CHECKPOINTS_JOB_KEY_FILE or KUMIKI_CHECKPOINTS_KUBE_AUDIENCE is set (the development stack runs
without either; the chart sets the audience from services.preemption.jobTokens.kubeAudience). Refusals are
PERMISSION_DENIED (an identity that is not the job's) or UNAUTHENTICATED (none presented, or a token Kubernetes
does not accept), each logged once at WARNING within a budget, so a caller cannot fill the disk.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass, field
from typing import NoReturn

import grpc
from prometheus_client import Counter

from kumiki.common.config import Environ, env_key
from kumiki.common.grpcutil import LogBudget
from kumiki.preemption.adapters.kube_identity import KubeTokenReviewer, looks_like_service_account_token

log = logging.getLogger(__name__)

KEY_FILE = "KUMIKI_CHECKPOINTS_JOB_KEY_FILE"
CERT_PREFIX = "job:"
REFUSED = Counter("kumiki_checkpoints_refused_total", "Checkpoints calls refused: not the job's own identity", ["code"])


def job_token(key: bytes, job_id: str) -> str:
    """The token that proves to the Checkpoints service that the caller is job `job_id`."""
    return hmac.new(key, job_id.encode(), hashlib.sha256).hexdigest()


class IdentityRefused(PermissionError):
    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass
class JobIdentity:
    key: bytes | None = field(default=None, repr=False)  # HMAC job tokens; None: not accepted
    kube: KubeTokenReviewer | None = None  # pods' ServiceAccount tokens; None: not accepted
    budget: LogBudget = field(default_factory=LogBudget)

    @classmethod
    def from_env(cls, env: Environ) -> JobIdentity | None:
        key = env_key(env, KEY_FILE)
        kube = KubeTokenReviewer.from_env(env)
        return cls(key, kube) if key is not None or kube is not None else None

    async def close(self) -> None:
        if self.kube is not None:
            await self.kube.close()

    def caller(self, context: grpc.aio.ServicerContext) -> tuple[str, str] | None:
        """('certificate', common name) or ('token', token) as presented; None when neither is."""
        auth = context.auth_context() or {}
        names = auth.get("x509_common_name") or []
        if names:
            name = names[0]
            return "certificate", name.decode() if isinstance(name, bytes) else str(name)
        for key, value in context.invocation_metadata() or ():
            if key.lower() == "authorization":
                text = value.decode() if isinstance(value, bytes) else value
                scheme, _, token = text.partition(" ")
                return "token", token.strip() if scheme.lower() == "bearer" else ""
        return None

    async def check(self, context: grpc.aio.ServicerContext, method: str, job_id: str) -> None:
        """Raises IdentityRefused unless the caller is job `job_id` (logged, within the budget)."""
        presented = self.caller(context)
        if presented is None:
            self._refuse(method, job_id, None, grpc.StatusCode.UNAUTHENTICATED, "no job token or client certificate")
        kind, value = presented
        if kind == "certificate":
            if value == CERT_PREFIX + job_id:
                return
            self._refuse(method, job_id, value, grpc.StatusCode.PERMISSION_DENIED,
                         f"job {job_id}: certificate {value!r} is not {CERT_PREFIX}{job_id}")  # fmt: skip
        if self.kube is not None and looks_like_service_account_token(value):
            verdict = await self.kube.job(value)
            if verdict.code is grpc.StatusCode.OK and verdict.job == job_id:
                return
            if verdict.code is grpc.StatusCode.OK:
                self._refuse(method, job_id, f"pod:{verdict.pod}", grpc.StatusCode.PERMISSION_DENIED,
                             f"job {job_id}: the token is pod {verdict.pod}'s, of job {verdict.job}")  # fmt: skip
            self._refuse(method, job_id, f"pod:{verdict.pod}" if verdict.pod else "token", verdict.code,
                         f"job {job_id}: {verdict.reason}")  # fmt: skip
        if self.key is not None and hmac.compare_digest(value.encode(), job_token(self.key, job_id).encode()):
            return
        self._refuse(method, job_id, "token", grpc.StatusCode.PERMISSION_DENIED,
                     f"job {job_id}: the token is not this job's")  # fmt: skip

    def _refuse(self, method: str, job_id: str, identity: str | None, code: grpc.StatusCode, reason: str) -> NoReturn:
        REFUSED.labels(code.name).inc()
        left_out = self.budget.take()
        if left_out is not None:
            log.warning(
                "checkpoints call refused",
                extra={"method": method, "job": job_id, "identity": identity, "reason": reason,
                       "code": code.name, "not_logged_since_last": left_out},
            )  # fmt: skip
        raise IdentityRefused(code, reason)
