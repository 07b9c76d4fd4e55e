"""Who a projected ServiceAccount token belongs to, asked of the Kubernetes API server itself.

A pod mounts a token for an audience a Kumiki service names; the service asks the API server (TokenReview)
whether the token is valid for that audience and which pod it is bound to, then reads that pod (GET) for what
the caller may claim: its job annotation (Checkpoints, `kumiki.preemption.adapters.kube_identity`), the node it
runs on and its service account (telemetry's agents, `kumiki.telemetry.adapters.agent_identity`). Nothing hands
out tokens, there is no shared key, and a token dies with its pod. The service needs two rules: create
tokenreviews, get pods.

Answers are kept for `cache_s` per token digest, so a caller presenting its token on every call costs the API
server one review per token per `cache_s`; a deleted pod's token is therefore honoured for at most that long. An
API outage is never kept as an answer. With `revalidate_in_background` (telemetry: every record carries a token,
and a stage-1 batch must not wait on the API server), an expired answer still stands while one review per token
runs in the background to replace it, and through an outage, retried every `OUTAGE_RETRY_S`.
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

import httpx2
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
OUTAGE_RETRY_S = 10.0


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
        revalidate_in_background: bool = False,
    ) -> None:
        self.client = client
        self.audience = audience
        self.clock = clock
        self.cache_s = cache_s  # 0: every call asks the API server (benchmarks/checkpoint_identity.py)
        self.revalidate_in_background = revalidate_in_background
        self.reviews = 0  # answers asked of the API server (what the cache saves)
        self._cache: OrderedDict[bytes, tuple[float, PodToken]] = OrderedDict()
        self._revalidating: dict[bytes, asyncio.Task[None]] = {}

    async def close(self) -> None:
        for task in self._revalidating.values():
            task.cancel()
        await asyncio.gather(*self._revalidating.values(), return_exceptions=True)
        await self.client.close()

    async def review(self, token: str) -> PodToken:
        digest = hashlib.sha256(token.encode()).digest()
        kept = self._kept(digest, token)
        if kept is not None:
            return kept
        now = self.clock()
        answer = await self._review(token)
        if answer.answer is not Answer.UNAVAILABLE:  # never kept: asked again next time
            self._keep(digest, now + self.cache_s, answer)
        return answer

    def kept(self, token: str) -> PodToken | None:
        """The answer `review` would give without asking the API server, else None (a caller reviewing many
        tokens at once skips a coroutine per known one)."""
        return self._kept(hashlib.sha256(token.encode()).digest(), token)

    def _kept(self, digest: bytes, token: str) -> PodToken | None:
        cached = self._cache.get(digest)
        if cached is None:
            return None
        self._cache.move_to_end(digest)
        if cached[0] > self.clock():
            return cached[1]
        if not self.revalidate_in_background:
            return None
        if digest not in self._revalidating:
            self._revalidating[digest] = asyncio.create_task(self._revalidate(digest, token))
        return cached[1]

    def _keep(self, digest: bytes, until: float, answer: PodToken) -> None:
        self._cache[digest] = (until, answer)  # no await between the read and this write: no lock needed
        self._cache.move_to_end(digest)
        while len(self._cache) > CACHE_ENTRIES:
            self._cache.popitem(last=False)

    async def _revalidate(self, digest: bytes, token: str) -> None:
        try:
            answer = await self._review(token)
            cached = self._cache.get(digest)
            if answer.answer is not Answer.UNAVAILABLE:
                self._keep(digest, self.clock() + self.cache_s, answer)
            elif cached is not None:  # the API server is away: the last answer stands a while longer
                self._keep(digest, self.clock() + OUTAGE_RETRY_S, cached[1])
        finally:
            self._revalidating.pop(digest, None)

    async def _review(self, token: str) -> PodToken:
        self.reviews += 1
        try:
            review = await asyncio.wait_for(
                self.client.create(TokenReview(spec=TokenReviewSpec(token=token, audiences=[self.audience]))),
                REVIEW_TIMEOUT_S,
            )
        except (ApiError, OSError, TimeoutError, httpx2.TransportError) as error:  # refused, reset, timed out
            why = str(error) or type(error).__name__
            return PodToken(Answer.UNAVAILABLE, f"cannot review the token with the API: {why}")
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
        except (OSError, TimeoutError, httpx2.TransportError) as error:
            return PodToken(Answer.UNAVAILABLE, f"cannot read pod {pod}: {error or type(error).__name__}", pod=pod)
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
