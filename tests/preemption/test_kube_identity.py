"""Checkpoints takes a job's calls with the pod's own projected ServiceAccount token, reviewed by a real
kube-apiserver (TokenReview), and the job named by the pod's kumiki.io/job annotation (what the binder writes
when it binds; set directly here, the binder's writing is tested in tests/binder). The service reviews as a
service account holding only the chart's two rules (create tokenreviews, get pods). Tokens are minted the way
the kubelet mints them for a projected volume (TokenRequest bound to the pod). Real gRPC on loopback, the real
Postgres registry."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount

from kumiki.binder.adapters.kube import client_from
from kumiki.binder.core.names import GENERATION_ANNOTATION, JOB_ANNOTATION, POD_GROUP_LABEL
from kumiki.binder.core.pods import job_id_for
from kumiki.common.config import DatabaseSettings
from kumiki.preemption.adapters.identity import JobIdentity
from kumiki.preemption.adapters.kube_identity import AUDIENCE_VARIABLE, KubeTokenReviewer
from kumiki.preemption.adapters.registry import CheckpointRegistry
from kumiki.sdk.checkpoint import Job
from tests.binder.support import pod_object, pod_token, reviewer_kubeconfig
from tests.conftest import REPO_ROOT
from tests.preemption.servers import checkpoints_service
from tests.preemption.test_identity import _refusals, _report, report

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
AUDIENCE = "kumiki-checkpoints"


@dataclass
class Cluster:
    client: AsyncClient  # the admin
    namespace: str
    pods: dict[str, Any]  # name -> Pod
    kubeconfig: Path  # the preemption service's own service account: two rules, nothing else

    async def token(self, pod: str | None, audience: str = AUDIENCE, account: str = "trainer") -> str:
        """What the kubelet writes into a pod's projected serviceAccountToken volume."""
        bound = self.pods[pod] if pod is not None else None
        return await pod_token(self.client, self.namespace, bound, audience=audience, account=account)


@pytest.fixture
async def cluster(kube: AsyncClient, kube_stack: Any, tmp_path: Path) -> Cluster:
    run = tmp_path.name[-8:].lower().replace("_", "-").strip("-") or "run"
    namespace = f"ids-{run}"
    await kube.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    await kube.create(ServiceAccount.from_dict({"metadata": {"name": "trainer", "namespace": namespace}}))
    pods = {}
    for name, job in (("gang-a-0", f"{namespace}/gang-a"), ("gang-b-0", f"{namespace}/gang-b"), ("stray", "")):
        manifest = pod_object(namespace, name)
        manifest["spec"]["serviceAccountName"] = "trainer"
        if job:
            manifest["metadata"]["annotations"]["kumiki.io/job"] = job
        pods[name] = await kube.create(Pod.from_dict(manifest))
    kubeconfig = await reviewer_kubeconfig(kube, kube_stack, tmp_path, run, "kumiki-preemption")
    return Cluster(kube, namespace, pods, kubeconfig)


@pytest.fixture
async def served(
    cluster: Cluster, database_settings: DatabaseSettings
) -> AsyncIterator[tuple[str, CheckpointRegistry]]:
    identity = JobIdentity(kube=KubeTokenReviewer(client_from(cluster.kubeconfig), AUDIENCE))
    async with checkpoints_service(database_settings, identity) as (address, pool):
        yield address, CheckpointRegistry(pool)


async def _refused(address: str, job: str, token: str) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _report(address, report(job), token)
    return refused.value


async def test_a_pods_own_token_reports_for_its_job_and_no_other(
    cluster: Cluster, served: tuple[str, CheckpointRegistry], caplog: pytest.LogCaptureFixture
) -> None:
    address, registry = served
    ns = cluster.namespace
    caplog.set_level(logging.WARNING)
    gang_a = await cluster.token("gang-a-0")
    await _report(address, report(f"{ns}/gang-a"), gang_a)
    latest = await registry.latest(f"{ns}/gang-a")
    assert latest is not None and latest.step == 100

    other = await _refused(address, f"{ns}/gang-b", gang_a)
    assert other.code() == grpc.StatusCode.PERMISSION_DENIED
    assert other.details() == f"job {ns}/gang-b: the token is pod {ns}/gang-a-0's, of job {ns}/gang-a"
    assert await registry.latest(f"{ns}/gang-b") is None

    audience = await _refused(address, f"{ns}/gang-a", await cluster.token("gang-a-0", audience="someone-else"))
    assert audience.code() == grpc.StatusCode.UNAUTHENTICATED
    assert f"did not accept the token for audience '{AUDIENCE}'" in audience.details()

    stray = await _refused(address, f"{ns}/stray", await cluster.token("stray"))
    assert stray.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stray.details() == (
        f"job {ns}/stray: pod {ns}/stray carries no kumiki.io/job annotation: Kumiki's binder has not bound it"
    )

    unbound = await _refused(address, f"{ns}/gang-a", await cluster.token(None))
    assert unbound.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not bound to a pod (mount a projected serviceAccountToken)" in unbound.details()

    # a token dies with its pod: the API server no longer vouches for it
    gang_b = await cluster.token("gang-b-0")
    await cluster.client.delete(Pod, "gang-b-0", namespace=ns, grace_period=0)
    gone = await _refused(address, f"{ns}/gang-b", gang_b)
    assert gone.code() == grpc.StatusCode.UNAUTHENTICATED

    refusals = _refusals(caplog)
    assert len(refusals) == 5
    assert refusals[0].identity == f"pod:{ns}/gang-a-0"  # type: ignore[attr-defined]


async def test_the_sdk_sends_the_token_the_kubelet_rotated(
    cluster: Cluster, served: tuple[str, CheckpointRegistry], tmp_path: Path
) -> None:
    """The SDK reads KUMIKI_JOB_TOKEN_FILE again when the file changes: after the kubelet's rotation it sends the
    new token (here, to show it was read, a token of another pod, which is then refused)."""
    address, registry = served
    ns = cluster.namespace
    token_file = tmp_path / "token"
    token_file.write_text(await cluster.token("gang-a-0"))
    env = {
        "KUMIKI_JOB_ID": f"{ns}/gang-a",
        "KUMIKI_CHECKPOINTS_ADDRESS": address,
        "KUMIKI_JOB_TOKEN_FILE": str(token_file),
    }
    job = Job.from_env(env)
    try:
        assert await asyncio.to_thread(job.report_checkpoint, "s3://ckpt/a/1", 1)  # the SDK blocks
        rotated = tmp_path / "token.new"
        rotated.write_text(await cluster.token("gang-a-0"))
        rotated.replace(token_file)  # as the kubelet swaps a projected volume's files
        assert await asyncio.to_thread(job.report_checkpoint, "s3://ckpt/a/2", 2)
        latest = await registry.latest(f"{ns}/gang-a")
        assert latest is not None and latest.step == 2
        rotated.write_text(await cluster.token("gang-b-0"))
        rotated.replace(token_file)
        with pytest.raises(grpc.RpcError) as refused:
            await asyncio.to_thread(job.report_checkpoint, "s3://ckpt/a/3", 3)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(job.close)


def test_the_audience_variable_is_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kumiki.common.config import ConfigError

    with pytest.raises(ConfigError, match=f"{AUDIENCE_VARIABLE}: one audience name without spaces"):
        JobIdentity.from_env({AUDIENCE_VARIABLE: "two words"})
    with pytest.raises(ConfigError, match="KUMIKI_KUBECONFIG: no file at"):
        JobIdentity.from_env({AUDIENCE_VARIABLE: AUDIENCE, "KUMIKI_KUBECONFIG": str(tmp_path / "missing")})
    assert JobIdentity.from_env({}) is None


async def test_the_documented_pod_is_accepted_and_reports_as_its_job(
    cluster: Cluster, served: tuple[str, CheckpointRegistry], tmp_path: Path
) -> None:
    """docs/examples/checkpointing-job.yaml, as written (in this test's namespace): the API server takes it, the
    audience it mounts is the one the service reviews for, and the SDK with its environment (the downward API's
    values resolved from the annotations the binder writes) reports as the pod's job."""
    address, registry = served
    manifest = yaml.safe_load((REPO_ROOT / "docs" / "examples" / "checkpointing-job.yaml").read_text())
    ns = cluster.namespace
    manifest["metadata"]["namespace"] = ns
    manifest["spec"]["serviceAccountName"] = "trainer"
    group = manifest["metadata"]["labels"][POD_GROUP_LABEL]
    manifest["metadata"]["annotations"] = {JOB_ANNOTATION: job_id_for(ns, group, ""), GENERATION_ANNOTATION: "1"}
    pod = await cluster.client.create(Pod.from_dict(manifest))
    cluster.pods[manifest["metadata"]["name"]] = pod
    [source] = manifest["spec"]["volumes"][0]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == AUDIENCE
    token_path = Path(manifest["spec"]["containers"][0]["env"][3]["value"])
    token_file = tmp_path / token_path.name
    token_file.write_text(await cluster.token(manifest["metadata"]["name"]))
    env = {}
    for variable in manifest["spec"]["containers"][0]["env"]:
        if "valueFrom" in variable:  # metadata.annotations['kumiki.io/job'] -> the annotation
            key = variable["valueFrom"]["fieldRef"]["fieldPath"].split("'")[1]
            env[variable["name"]] = manifest["metadata"]["annotations"][key]
        else:
            env[variable["name"]] = variable["value"]
    env.update(KUMIKI_CHECKPOINTS_ADDRESS=address, KUMIKI_JOB_TOKEN_FILE=str(token_file))
    job = Job.from_env(env)
    try:
        assert await asyncio.to_thread(job.report_checkpoint, "s3://ckpt/train/7", 7)
    finally:
        await asyncio.to_thread(job.close)
    latest = await registry.latest(f"{ns}/{group}")
    assert latest is not None and latest.step == 7


async def test_an_answer_is_kept_for_its_minute_and_not_without_a_cache(cluster: Cluster) -> None:
    """What docs/preemption.md promises about a deleted pod: its token is honoured until the kept answer
    expires (a minute), and at once with no cache."""
    token = await cluster.token("gang-a-0")
    cached = KubeTokenReviewer(client_from(cluster.kubeconfig), AUDIENCE)
    uncached = KubeTokenReviewer(client_from(cluster.kubeconfig), AUDIENCE, cache_s=0.0)
    try:
        assert (await cached.job(token)).job == f"{cluster.namespace}/gang-a"
        assert (await uncached.job(token)).job == f"{cluster.namespace}/gang-a"
        await cluster.client.delete(Pod, "gang-a-0", namespace=cluster.namespace, grace_period=0)
        assert (await cached.job(token)).job == f"{cluster.namespace}/gang-a"  # the kept answer
        assert (await uncached.job(token)).code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await cached.close()
        await uncached.close()
