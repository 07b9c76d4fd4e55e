"""Who a projected ServiceAccount token belongs to, asked of the Kubernetes API server itself.

A pod mounts a token for an audience a Kumiki service names; the service asks the API server (TokenReview)
whether the token is valid for that audience and which pod it is bound to, then reads that pod (GET) for what
the caller may claim: its job annotation (Checkpoints, `kumiki.preemption.adapters.kube_identity`), the node it
runs on and its service account (telemetry's agents, `kumiki.telemetry.adapters.agent_tokens`). Nothing hands
out tokens, there is no shared key, and a token dies with its pod. The service needs two rules: create
tokenreviews, get pods.

Answers are kept for `cache_s` per token digest, so a caller presenting its token on every call costs the API
server one review per token per `cache_s`; a deleted pod's token is therefore honoured for at most that long. An
API outage is never cached; with `keep_through_outage` the last answer for the same token stands in for one
(telemetry: an agent proven a minute ago is not dropped because the API server restarts).
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.core_v1 import Pod

from kumiki.common.config import ConfigError, Environ

POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
CACHE_S = 60.0
CACHE_ENTRIES = 10_000
REVIEW_TIMEOUT_S = 10.0


def looks_like_service_account_token(token: str) -> bool:
    """A JWT (three base64url parts, a JSON header): what Kubernetes issues; Kumiki's HMAC tokens are hex."""
    return token.startswith("eyJ") and token.count(".") == 2


class Answer(enum.Enum):
    BOUND_POD = "bound pod"  # valid, bound to a pod that exists: `PodToken` says which
    UNAUTHENTICATED = "unauthenticated"  # not valid for the audience, or its pod is gone or replaced
    NOT_A_POD = "not a pod"  # valid, but not bound to a pod (a legacy or TokenRequest token without one)
    UNAVAILABLE = "unavailable"  # the API server did not answer: ask again


@dataclass(frozen=True)
class PodToken:
    """What the API server says about one token."""

    answer: Answer
    reason: str = ""  # why it is not a bound pod's
    pod: str = ""  # namespace/name
    account: str = ""  # namespace/name of the pod's service account
    node: str = ""  # spec.nodeName; "" while the pod is not scheduled
    annotations: Mapping[str, str] = field(default_factory=dict)


def audience_from_env(env: Environ, variable: str) -> str:
    """The audience a service reviews tokens for; "" when the variable is unset (pods' tokens not accepted)."""
    audience = env.get(variable, "").strip()
    if audience and (any(character.isspace() for character in audience) or len(audience) > 253):
        raise ConfigError(f"{variable}: one audience name without spaces, got {audience!r}")
    return audience


def api_client_from_env(env: Environ, variable: str) -> AsyncClient:
    """The Kubernetes client a reviewer uses: KUMIKI_KUBECONFIG, else the pod's own service account."""
    from kumiki.binder.adapters.kube import client_from, kubeconfig_from_env

    kubeconfig = kubeconfig_from_env(env)
    if kubeconfig is not None and not Path(kubeconfig).is_file():
        raise ConfigError(f"KUMIKI_KUBECONFIG: no file at {str(kubeconfig)!r}")
    try:
        return client_from(kubeconfig)
    except Exception as error:  # lightkube: no kubeconfig and not in a pod
        raise ConfigError(
            f"{variable}: reviewing tokens needs the Kubernetes API (KUMIKI_KUBECONFIG, or the pod's service"
            f" account): {error}"
        ) from None


class PodTokenReviewer:
    """Reviews projected ServiceAccount tokens for one audience (needs `create tokenreviews` and `get pods`)."""

    def __init__(
        self,
        client: AsyncClient,
        audience: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        cache_s: float = CACHE_S,
        keep_through_outage: bool = False,
    ) -> None:
        self.client = client
        self.audience = audience
        self.clock = clock
        self.cache_s = cache_s  # 0: every call asks the API server (benchmarks/checkpoint_identity.py)
        self.keep_through_outage = keep_through_outage
        self.reviews = 0  # answers asked of the API server (what the cache saves)
        self._cache: OrderedDict[bytes, tuple[float, PodToken]] = OrderedDict()

    async def close(self) -> None:
        await self.client.close()

    async def review(self, token: str) -> PodToken:
        digest = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        cached = self._cache.get(digest)
        if cached is not None and cached[0] > now:
            self._cache.move_to_end(digest)
            return cached[1]
        answer = await self._review(token)
        if answer.answer is Answer.UNAVAILABLE:  # never kept: asked again next time
            if self.keep_through_outage and cached is not None:
                return cached[1]
            return answer
        self._cache[digest] = (now + self.cache_s, answer)  # no await in between: no lock needed
        self._cache.move_to_end(digest)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)
        return answer

    async def _review(self, token: str) -> PodToken:
        self.reviews += 1
        try:
            review = await asyncio.wait_for(
                self.client.create(TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))),
                REVIEW_TIMEOUT_S,
            )
        except (ApiError, OSError, TimeoutError) as error:
            return PodToken(Answer.UNAVAILABLE, f"cannot review the token with the API: {error}")
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            why = (status.error if status is not None else None) or "not authenticated"
            return PodToken(
                Answer.UNAUTHENTICATED,
                f"the Kubernetes API did not accept the token for audience {self.audience!r} ({why})",
            )
        return await self._pod(status.user.username or "", status.user.extra or {})

    async def _pod(self, username: str, extra: Mapping[str, Any]) -> PodToken:
        namespace, _, account = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")
        names, uids = extra.get(POD_NAME) or [], extra.get(POD_UID) or []
        if not username.startswith(SERVICE_ACCOUNT_PREFIX) or not names:
            return PodToken(
                Answer.NOT_A_POD,
                f"the token is {username!r}'s, not bound to a pod (mount a projected serviceAccountToken)",
            )
        pod = f"{namespace}/{names[0]}"
        try:
            found = await asyncio.wait_for(self.client.get(Pod, names[0], namespace=namespace), REVIEW_TIMEOUT_S)
        except ApiError as error:
            if error.status.code == 404:
                return PodToken(Answer.UNAUTHENTICATED, f"pod {pod} no longer exists", pod=pod)
            return PodToken(Answer.UNAVAILABLE, f"cannot read pod {pod}: {error}", pod=pod)
        except (OSError, TimeoutError) as error:
            return PodToken(Answer.UNAVAILABLE, f"cannot read pod {pod}: {error}", pod=pod)
        metadata = found.metadata
        if metadata is None or (uids and metadata.uid != uids[0]):
            return PodToken(Answer.UNAUTHENTICATED, f"the token's pod {pod} was replaced", pod=pod)
        return PodToken(
            Answer.BOUND_POD,
            pod=pod,
            account=f"{namespace}/{account}",
            node=(found.spec.nodeName if found.spec is not None else None) or "",
            annotations=dict(metadata.annotations or {}),
        )
