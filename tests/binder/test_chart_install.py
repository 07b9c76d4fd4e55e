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


def rendered(namespace: str) -> str:
    assert HELM is not None
    result = subprocess.run(
        [HELM, "template", "kumiki", str(CHART), "--namespace", namespace, "--include-crds"],
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
