"""A job's identity from Kubernetes itself: the pod's projected ServiceAccount token, reviewed by the API server.

A pod mounts a token for the audience the Checkpoints service names (`KUMIKI_CHECKPOINTS_KUBE_AUDIENCE`), and the
SDK sends it (`KUMIKI_JOB_TOKEN_FILE`, re-read as the kubelet rotates it). The service asks the API server
(TokenReview) whether the token is valid for that audience and which pod it is bound to, then reads the pod's
`kumiki.io/job` annotation, which only the binder writes, when it binds the pod. So nothing hands out tokens,
there is no shared key, and a token dies with its pod.

Answers are kept for a short while (`CACHE_S`) per token digest, so a job reporting every few seconds costs the
API server one review a minute; a deleted pod's token is therefore honoured for at most that long.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.core_v1 import Pod

from kumiki.binder.core.names import JOB_ANNOTATION  # written by the binder at bind time
from kumiki.common.config import ConfigError, Environ

AUDIENCE_VARIABLE = "KUMIKI_CHECKPOINTS_KUBE_AUDIENCE"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
CACHE_S = 60.0
CACHE_ENTRIES = 10_000
REVIEW_TIMEOUT_S = 10.0


def looks_like_service_account_token(token: str) -> bool:
    """A JWT (three base64url parts, a JSON header): what Kubernetes issues; the HMAC tokens are hex."""
    return token.startswith("eyJ") and token.count(".") == 2


@dataclass(frozen=True)
class Verdict:
    """Whose token it is: `job` when the API server vouches for a pod that Kumiki bound, else the refusal."""

    job: str = ""
    pod: str = ""  # namespace/name
    code: grpc.StatusCode = grpc.StatusCode.OK
    reason: str = ""


class KubeTokenReviewer:
    """Reviews projected ServiceAccount tokens with the API server (needs `create tokenreviews` and `get pods`)."""

    def __init__(
        self,
        client: AsyncClient,
        audience: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        cache_s: float = CACHE_S,
    ) -> None:
        self.client = client
        self.audience = audience
        self.clock = clock
        self.cache_s = cache_s  # 0: every call asks the API server (benchmarks/checkpoint_identity.py)
        self._cache: OrderedDict[bytes, tuple[float, Verdict]] = OrderedDict()

    @classmethod
    def from_env(cls, env: Environ) -> KubeTokenReviewer | None:
        audience = env.get(AUDIENCE_VARIABLE, "").strip()
        if not audience:
            return None
        if any(character.isspace() for character in audience) or len(audience) > 253:
            raise ConfigError(f"{AUDIENCE_VARIABLE}: one audience name without spaces, got {audience!r}")
        from kumiki.binder.adapters.kube import client_from, kubeconfig_from_env

        kubeconfig = kubeconfig_from_env(env)
        if kubeconfig is not None and not Path(kubeconfig).is_file():
            raise ConfigError(f"KUMIKI_KUBECONFIG: no file at {str(kubeconfig)!r}")
        try:
            client = client_from(kubeconfig)
        except Exception as error:  # lightkube: no kubeconfig and not in a pod
            raise ConfigError(
                f"{AUDIENCE_VARIABLE}: reviewing tokens needs the Kubernetes API (KUMIKI_KUBECONFIG, or the pod's"
                f" service account): {error}"
            ) from None
        return cls(client, audience)

    async def close(self) -> None:
        await self.client.close()

    async def review(self, token: str) -> Verdict:
        digest = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            self._cache.move_to_end(digest)
            return cached[1]
        verdict = await self._review(token)
        if verdict.code is not grpc.StatusCode.UNAVAILABLE:  # an API outage is asked again next time
            self._cache[digest] = (now + self.cache_s, verdict)  # no await in between: no lock needed
            self._cache.move_to_end(digest)
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return verdict

    async def _review(self, token: str) -> Verdict:
        try:
            review = await asyncio.wait_for(
                self.client.create(TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))),
                REVIEW_TIMEOUT_S,
            )
        except (ApiError, OSError, TimeoutError) as error:
            return Verdict(code=grpc.StatusCode.UNAVAILABLE, reason=f"cannot review the token with the API: {error}")
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            why = (status.error if status is not None else None) or "not authenticated"
            return Verdict(
                code=grpc.StatusCode.UNAUTHENTICATED,
                reason=f"the Kubernetes API did not accept the token for audience {self.audience!r} ({why})",
            )
        return await self._pod_job(status.user.username or "", status.user.extra or {})

    async def _pod_job(self, username: str, extra: Mapping[str, Any]) -> Verdict:
        namespace = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")[0]
        names, uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not names:
            return Verdict(
                code=grpc.StatusCode.PERMISSION_DENIED,
                reason=f"the token is {username!r}'s, not bound to a pod (mount a projected serviceAccountToken)",
            )
        pod = f"{namespace}/{names[0]}"
        try:
            found = await asyncio.wait_for(self.client.get(Pod, names[0], namespace=namespace), REVIEW_TIMEOUT_S)
        except ApiError as error:
            if error.status.code == 404:
                return Verdict(pod=pod, code=grpc.StatusCode.UNAUTHENTICATED, reason=f"pod {pod} no longer exists")
            return Verdict(code=grpc.StatusCode.UNAVAILABLE, reason=f"cannot read pod {pod}: {error}")
        except (OSError, TimeoutError) as error:
            return Verdict(code=grpc.StatusCode.UNAVAILABLE, reason=f"cannot read pod {pod}: {error}")
        metadata = found.metadata
        if metadata is None or (uids and metadata.uid != uids[0]):
            return Verdict(pod=pod, code=grpc.StatusCode.UNAUTHENTICATED, reason=f"the token's pod {pod} was replaced")
        job = (metadata.annotations or {}).get(JOB_ANNOTATION, "")
        if not job:
            return Verdict(
                pod=pod,
                code=grpc.StatusCode.PERMISSION_DENIED,
                reason=f"pod {pod} carries no {JOB_ANNOTATION} annotation: Kumiki's binder has not bound it",
            )
        return Verdict(job=job, pod=pod)
