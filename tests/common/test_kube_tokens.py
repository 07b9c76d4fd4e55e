"""Reviewing pods' projected tokens with a real kube-apiserver (v1.37.2): what the answer carries, how long it is
kept, and what stands in for it while the API server is away (telemetry's background revalidation) or not
(Checkpoints' per-call review)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from kumiki.binder.adapters.kube import client_from
from kumiki.common.kube_tokens import OUTAGE_RETRY_S, Answer, PodTokenReviewer
from kumiki.devstack.processes import free_port
from tests.binder.support import pod_object, pod_token, reviewer_kubeconfig

pytestmark = [pytest.mark.slow]
AUDIENCE = "kumiki-test"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _agent(kube: AsyncClient, namespace: str) -> tuple[Any, str]:
    await kube.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    await kube.create(ServiceAccount.from_dict({"metadata": {"name": "kumiki-agent", "namespace": namespace}}))
    manifest = pod_object(namespace, "agent-0", labels={"app": "agent"})
    manifest["metadata"]["annotations"]["kumiki.io/job"] = f"{namespace}/j"
    manifest["spec"] |= {"serviceAccountName": "kumiki-agent", "nodeName": "gpu-node-3"}
    pod = await kube.create(Pod.from_dict(manifest))
    return pod, await pod_token(kube, namespace, pod, audience=AUDIENCE, account="kumiki-agent")


def _unreachable(kubeconfig: Path, folder: Path) -> AsyncClient:
    """The same credentials against an address nothing listens on: the API server is away."""
    config = json.loads(kubeconfig.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    path = folder / "away.kubeconfig"
    path.write_text(json.dumps(config))
    return client_from(path)


@pytest.fixture
async def setting(kube: AsyncClient, kube_stack: Any, tmp_path: Path) -> tuple[Any, str, Path]:
    run = tmp_path.name[-8:].lower().replace("_", "-").strip("-") or "run"
    pod, token = await _agent(kube, f"tokens-{run}")
    return pod, token, await reviewer_kubeconfig(kube, kube_stack, tmp_path, run, "kumiki-reviewer")


async def test_the_answer_names_the_pod_its_account_node_and_annotations(setting: tuple[Any, str, Path]) -> None:
    pod, token, kubeconfig = setting
    reviewer = PodTokenReviewer(client_from(kubeconfig), AUDIENCE)
    try:
        answer = await reviewer.review(token)
        namespace = pod.metadata.namespace
        assert (answer.answer, answer.pod, answer.account, answer.node) == (
            Answer.BOUND_POD, f"{namespace}/agent-0", f"{namespace}/kumiki-agent", "gpu-node-3"
        )  # fmt: skip
        assert answer.annotations["kumiki.io/job"] == f"{namespace}/j"
        other = PodTokenReviewer(client_from(kubeconfig), "another-audience")
        refused = await other.review(token)
        await other.close()
        assert refused.answer is Answer.UNAUTHENTICATED and "'another-audience'" in refused.reason
    finally:
        await reviewer.close()


async def test_an_expired_answer_stands_while_it_is_revalidated_then_a_deleted_pod_is_refused(
    setting: tuple[Any, str, Path], kube: AsyncClient
) -> None:
    pod, token, kubeconfig = setting
    clock = Clock()
    reviewer = PodTokenReviewer(client_from(kubeconfig), AUDIENCE, clock=clock, revalidate_in_background=True)
    try:
        assert (await reviewer.review(token)).answer is Answer.BOUND_POD and reviewer.reviews == 1
        await kube.delete(Pod, "agent-0", namespace=pod.metadata.namespace, grace_period=0)
        clock.now += 61
        # the expired answer stands for this call: the batch does not wait on the API server
        assert (await reviewer.review(token)).answer is Answer.BOUND_POD
        await asyncio.gather(*reviewer._revalidating.values())  # the one background review
        assert reviewer.reviews == 2
        refused = await reviewer.review(token)
        assert refused.answer is Answer.UNAUTHENTICATED
        assert refused.reason == f"pod {pod.metadata.namespace}/agent-0 no longer exists"
    finally:
        await reviewer.close()


async def test_through_an_outage_a_known_token_stands_and_retries_while_an_unknown_one_is_unavailable(
    setting: tuple[Any, str, Path], tmp_path: Path
) -> None:
    _, token, kubeconfig = setting
    clock = Clock()
    kept = PodTokenReviewer(client_from(kubeconfig), AUDIENCE, clock=clock, revalidate_in_background=True)
    per_call = PodTokenReviewer(client_from(kubeconfig), AUDIENCE, clock=clock)  # as Checkpoints reviews
    try:
        for reviewer in (kept, per_call):
            assert (await reviewer.review(token)).answer is Answer.BOUND_POD
            await reviewer.client.close()
            reviewer.client = _unreachable(kubeconfig, tmp_path)
        clock.now += 61
        assert (await kept.review(token)).answer is Answer.BOUND_POD
        await asyncio.gather(*kept._revalidating.values())
        assert kept.reviews == 2 and (await kept.review(token)).answer is Answer.BOUND_POD
        assert not kept._revalidating  # the outage's answer is kept OUTAGE_RETRY_S: no review on every call
        clock.now += OUTAGE_RETRY_S + 1
        assert (await kept.review(token)).answer is Answer.BOUND_POD and len(kept._revalidating) == 1
        away = await per_call.review(token)
        assert away.answer is Answer.UNAVAILABLE and "cannot review the token" in away.reason
        assert (await kept.review(token + "x")).answer is Answer.UNAVAILABLE  # never proven: nothing stands in
    finally:
        await kept.close()
        await per_call.close()
