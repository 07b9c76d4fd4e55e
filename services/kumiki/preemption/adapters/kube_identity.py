"""A job's identity from Kubernetes itself: the pod's projected ServiceAccount token, reviewed by the API server.

A pod mounts a token for the audience the Checkpoints service names (`KUMIKI_CHECKPOINTS_KUBE_AUDIENCE`), and the
SDK sends it (`KUMIKI_JOB_TOKEN_FILE`, re-read as the kubelet rotates it). The service asks the API server
(TokenReview) whether the token is valid for that audience and which pod it is bound to, then reads the pod's
`kumiki.io/job` annotation, which only the binder writes, when it binds the pod. So nothing hands out tokens,
there is no shared key, and a token dies with its pod.

Reviewing and caching are `kumiki.common.kube_tokens`'s (a minute per token digest, so a job reporting every few
seconds costs the API server one review a minute; a deleted pod's token is honoured for at most that long).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from kumiki.binder.core.names import JOB_ANNOTATION  # written by the binder at bind time
from kumiki.common.config import Environ
from kumiki.common.kube_tokens import (
    Answer,
    PodTokenReviewer,
    api_client_from_env,
    audience_from_env,
    looks_like_service_account_token,
)

__all__ = ["AUDIENCE_VARIABLE", "KubeTokenReviewer", "Verdict", "looks_like_service_account_token"]

AUDIENCE_VARIABLE = "KUMIKI_CHECKPOINTS_KUBE_AUDIENCE"
_CODES = {
    Answer.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Answer.NOT_A_POD: grpc.StatusCode.PERMISSION_DENIED,
    Answer.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


@dataclass(frozen=True)
class Verdict:
    """Whose token it is: `job` when the API server vouches for a pod that Kumiki bound, else the refusal."""

    job: str = ""
    pod: str = ""  # namespace/name
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""


class KubeTokenReviewer(PodTokenReviewer):
    """A job's pod's token → the job (`PodTokenReviewer` does the reviewing and the caching)."""

    @classmethod
    def from_env(cls, env: Environ) -> KubeTokenReviewer | None:
        audience = audience_from_env(env, AUDIENCE_VARIABLE)
        if not audience:
            return None
        return cls(api_client_from_env(env, AUDIENCE_VARIABLE), audience)

    async def job(self, token: str) -> Verdict:
        found = await self.review(token)
        if found.answer is not Answer.BOUND_POD:
            return Verdict(pod=found.pod, code=_CODES[found.answer], reason=found.reason)
        job = found.annotations.get(JOB_ANNOTATION, "")
        if not job:
            return Verdict(
                pod=found.pod,
                code=grpc.StatusCode.PERMISSION_DENIED,
                reason=f"pod {found.pod} carries no {JOB_ANNOTATION} annotation: Kumiki's binder has not bound it",
            )
        return Verdict(job=job, pod=found.pod)
