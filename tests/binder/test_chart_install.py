"""The rendered chart, CRDs included, applied to the real kube-apiserver (server-side apply): every object is
accepted, the PodGroup CRD serves, and the binder's RBAC allows what the binder does and nothing more."""

from __future__ import annotations

import contextlib
import subprocess

import pytest
import yaml
from lightkube import ApiError, AsyncClient
from lightkube.codecs import load_all_yaml
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authorization_v1 import SubjectAccessReview
from lightkube.resources.core_v1 import Namespace

from tests.binder.support import PodGroup, podgroup_object
from tests.charts.test_chart import CHART, HELM

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(HELM is None, reason="helm not installed: go install helm.sh/helm/v3/cmd/helm@v3.22.0"),
]


def rendered(namespace: str, *options: str) -> str:
    assert HELM is not None
    result = subprocess.run(
        [HELM, "template", "kumiki", str(CHART), "--namespace", namespace, "--include-crds", *options],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def allowed(client: AsyncClient, user: str, verb: str, resource: str, namespace: str = "", **extra: str) -> bool:
    resource_name, _, subresource = resource.partition("/")
    review = SubjectAccessReview(
        spec=SubjectAccessReviewSpec(
            user=user,
            groups=["system:serviceaccounts", "system:authenticated"],
            resourceAttributes=ResourceAttributes(
                verb=verb,
                group=extra.get("group", ""),
                resource=resource_name,
                subresource=subresource or None,
                namespace=namespace or None,
                name=extra.get("name"),
            ),
        )
    )
    answer = await client.create(review)
    assert answer.status is not None
    return bool(answer.status.allowed)


async def test_the_chart_installs_into_the_real_api_server_and_the_binder_rbac_is_least_privilege(
    kube: AsyncClient,
) -> None:
    namespace = "kumiki-chart"
    with contextlib.suppress(ApiError):  # the namespace outlives a test (no namespace controller deletes it)
        await kube.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    text = rendered(namespace)
    kinds = [doc["kind"] for doc in yaml.safe_load_all(text) if doc]
    objects = load_all_yaml(text)
    assert len(objects) == len(kinds)
    for obj in objects:
        applied = await kube.apply(obj, field_manager="kumiki-chart-test", force=True)
        assert applied.metadata is not None and applied.metadata.uid  # accepted and stored
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole", "Role", "ServiceAccount"} <= set(kinds)
    # the CRD serves: a PodGroup round-trips
    group = await kube.create(PodGroup.from_dict(podgroup_object(namespace, "probe", 3)))
    assert group.spec["minMember"] == 3  # type: ignore[index]

    user = f"system:serviceaccount:{namespace}:kumiki-binder"
    for verb, resource in (
        ("watch", "pods"),
        ("create", "pods/binding"),
        ("create", "pods/eviction"),
        ("patch", "pods/status"),
        ("list", "nodes"),
        ("create", "events"),
    ):
        assert await allowed(kube, user, verb, resource, "team-a"), f"{verb} {resource}"
    assert await allowed(kube, user, "watch", "podgroups", "team-a", group="scheduling.x-k8s.io")
    assert await allowed(kube, user, "patch", "podgroups/status", "team-a", group="scheduling.x-k8s.io")
    assert await allowed(kube, user, "update", "leases", namespace, group="coordination.k8s.io", name="kumiki-binder")
    for verb, resource in (("delete", "pods"), ("create", "pods"), ("get", "secrets"), ("update", "nodes")):
        assert not await allowed(kube, user, verb, resource, "team-a"), f"{verb} {resource} must be denied"
    assert not await allowed(kube, user, "update", "leases", namespace, group="coordination.k8s.io", name="other")
    assert not await allowed(
        kube, user, "update", "leases", "kube-system", group="coordination.k8s.io", name="kumiki-binder"
    )


async def test_with_pods_tokens_on_the_reviewers_may_review_and_the_agents_may_do_nothing(kube: AsyncClient) -> None:
    """Both token checks on: the DaemonSet's projected token volume and the reviewers' accounts are accepted by the
    API server, telemetry and preemption may create tokenreviews and get pods (nothing more), and the agents'
    own account may do nothing at all."""
    namespace = "kumiki-tokens"
    with contextlib.suppress(ApiError):
        await kube.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    text = rendered(
        namespace,
        "--set", "services.telemetryIngest.agentTokens.audience=kumiki-telemetry",
        "--set", "services.preemption.jobTokens.kubeAudience=kumiki-checkpoints",
    )  # fmt: skip
    for obj in load_all_yaml(text):
        if obj.kind != "CustomResourceDefinition":
            await kube.apply(obj, field_manager="kumiki-chart-test", force=True)
    daemonset = next(doc for doc in yaml.safe_load_all(text) if doc and doc["kind"] == "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["serviceAccountName"] == "kumiki-agent"
    for account in ("kumiki-telemetry-ingest", "kumiki-preemption"):
        user = f"system:serviceaccount:{namespace}:{account}"
        assert await allowed(kube, user, "create", "tokenreviews", group="authentication.k8s.io"), account
        assert await allowed(kube, user, "get", "pods", "team-a"), account
        for verb, resource in (("list", "pods"), ("get", "secrets"), ("create", "pods"), ("update", "nodes")):
            assert not await allowed(kube, user, verb, resource, "team-a"), f"{account}: {verb} {resource}"
    agent = f"system:serviceaccount:{namespace}:kumiki-agent"
    for verb, resource in (("create", "tokenreviews"), ("get", "pods"), ("get", "nodes"), ("get", "secrets")):
        group = "authentication.k8s.io" if resource == "tokenreviews" else ""
        assert not await allowed(kube, agent, verb, resource, "team-a", group=group), f"agent: {verb} {resource}"
