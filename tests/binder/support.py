"""Binder test helpers: a real control plane (etcd v3.7.0, kube-apiserver v1.37.2, KWOK v0.8.0 from
infra/kube/build.sh), placement and the binder as real processes on Apache Kafka, and KWOK GPU nodes, pods and
PodGroups made through lightkube."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.codecs import load_all_yaml
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from kumiki.binder import core
from kumiki.common.config import KafkaSettings
from kumiki.devstack.kube import FAKE_NODE_ANNOTATION, KubeStack
from kumiki.devstack.processes import free_port
from kumiki.devstack.stack import readiness
from tests.conftest import REPO_ROOT, wait_until

CRD_FILE = REPO_ROOT / "charts" / "kumiki" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"
PodGroup = create_namespaced_resource("scheduling.x-k8s.io", "v1alpha1", "PodGroup", "podgroups")
GPU_MODEL = "NVIDIA-A100-SXM4-80GB"


def api_client(stack: KubeStack) -> AsyncClient:
    return AsyncClient(config=KubeConfig.from_file(str(stack.kubeconfig)), field_manager="kumiki-tests")


async def install_crd(client: AsyncClient) -> None:
    for obj in load_all_yaml(CRD_FILE.read_text()):
        await client.apply(obj, field_manager="kumiki-tests", force=True)

    async def served() -> bool:
        try:
            async for _ in client.list(PodGroup, namespace="*"):
                break
            return True
        except (ApiError, httpx2.HTTPStatusError):  # 404 until the CRD is established
            return False

    await wait_until(served, timeout_s=30, what="the PodGroup CRD to serve")


def node_object(
    name: str,
    gpus: int = 8,
    *,
    mig: bool = False,
    shareable: bool = False,
    island: int = 4,
    rack: str = "rack-0",
    model: str = GPU_MODEL,
    cpu: str = "128",
    memory: str = "1024Gi",
) -> dict[str, Any]:
    labels = {
        "nvidia.com/gpu.product": model,
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.count": str(gpus),
        core.NODE_ISLAND_SIZE_LABEL: str(island),
        "kumiki.io/rack": rack,
        "type": "kwok",
    }
    allocatable: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": "256"}
    if mig:
        allocatable["nvidia.com/mig-1g.10gb"] = str(7 * gpus)
    else:
        allocatable[core.GPU_RESOURCE] = str(gpus)
    if shareable:
        labels[core.NODE_SHARING_LABEL] = "time-slicing"
    uuids = ",".join(f"GPU-{name}-{index}" for index in range(gpus))
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", core.NODE_GPU_UUIDS_ANNOTATION: uuids},
        },
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def pod_object(
    namespace: str,
    name: str,
    *,
    gpus: int = 0,
    mig: str = "",
    fraction: float = 0.0,
    gpu_memory: str = "",
    group: str = "",
    cpu: str = "1",
    memory: str = "1Gi",
    run_for: str = "",
    exit_code: int = 0,
    scheduler: str = core.SCHEDULER_NAME,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    limits: dict[str, str] = {}
    if gpus:
        limits[core.GPU_RESOURCE] = str(gpus)
    if mig:
        limits[f"{core.MIG_RESOURCE_PREFIX}{mig}"] = "1"
    annotations: dict[str, str] = {}
    if fraction:
        annotations[core.GPU_FRACTION_ANNOTATION] = str(fraction)
        annotations[core.GPU_MEMORY_ANNOTATION] = gpu_memory or "10Gi"
    if run_for:
        annotations["kumiki.io/run-for"] = run_for
    if exit_code:
        annotations["kumiki.io/exit-code"] = str(exit_code)
    pod_labels = dict(labels or {})
    if group:
        pod_labels[core.POD_GROUP_LABEL] = group
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels, "annotations": annotations},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": limits},
                }
            ],
        },
    }


def podgroup_object(namespace: str, name: str, min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member},
    }


async def create_all(client: AsyncClient, objects: Iterable[dict[str, Any]]) -> None:
    kinds = {"Node": Node, "Pod": Pod, "Namespace": Namespace, "PodGroup": PodGroup}
    for obj in objects:
        resource = kinds[obj["kind"]]
        await client.create(resource.from_dict(obj))  # type: ignore[attr-defined]


async def namespace(client: AsyncClient) -> str:
    name = f"t-{uuid.uuid4().hex[:8]}"
    await client.create(Namespace.from_dict({"metadata": {"name": name}}))
    return name


async def pods_in(client: AsyncClient, ns: str) -> list[dict[str, Any]]:
    return [pod.to_dict() async for pod in client.list(Pod, namespace=ns)]


async def clean_cluster(client: AsyncClient) -> None:
    """Every kumiki pod and every node go (force: no kubelet to wait for), so the next test starts empty."""
    async for pod in client.list(Pod, namespace="*"):
        assert pod.metadata is not None
        with contextlib.suppress(ApiError):
            await client.delete(Pod, pod.metadata.name, namespace=pod.metadata.namespace, grace_period=0)
    async for node in client.list(Node):
        assert node.metadata is not None
        with contextlib.suppress(ApiError):
            await client.delete(Node, node.metadata.name)


@dataclass
class Processes:
    """Placement and the binder as child processes (the binder can be SIGKILLed and started again)."""

    stack: KubeStack
    kafka: KafkaSettings
    folder: Path
    lease: str = field(default_factory=lambda: f"kumiki-binder-{uuid.uuid4().hex[:6]}")
    placement: subprocess.Popen[bytes] | None = None
    binders: list[subprocess.Popen[bytes]] = field(default_factory=list)
    placement_port: int = 0
    placement_http: int = 0
    binder_http: list[int] = field(default_factory=list)

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUMIKI_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "KUMIKI_TOPIC_PREFIX": self.kafka.topic_prefix,
            "PYTHONPATH": str(REPO_ROOT / "services"),
        }

    async def start_placement(self) -> None:
        self.placement_port, self.placement_http = free_port(), free_port()
        env = {
            **self._env(),
            "KUMIKI_PLACEMENT_GRPC_PORT": str(self.placement_port),
            "KUMIKI_PLACEMENT_HTTP_PORT": str(self.placement_http),
            "KUMIKI_PLACEMENT_CYCLE_S": "0.2",
        }
        with (self.folder / "placement.log").open("ab") as out:
            self.placement = subprocess.Popen(
                [sys.executable, "-m", "kumiki.placement"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        await wait_until(lambda: readiness(self.placement_http)[0] == "ready", timeout_s=90, what="placement ready")

    async def start_binder(self, wait_ready: bool = True, **extra: str) -> subprocess.Popen[bytes]:
        http = free_port()
        env = {
            **self._env(),
            "KUMIKI_KUBECONFIG": str(self.stack.kubeconfig),
            "KUMIKI_PLACEMENT_ADDRESS": f"127.0.0.1:{self.placement_port}",
            "KUMIKI_BINDER_GRPC_PORT": str(free_port()),
            "KUMIKI_BINDER_HTTP_PORT": str(http),
            "KUMIKI_BINDER_LEASE_NAME": self.lease,
            "KUMIKI_BINDER_LEASE_SECONDS": "6",
            "KUMIKI_INSTANCE": f"binder-{len(self.binders)}-{uuid.uuid4().hex[:4]}",
            **extra,
        }
        with (self.folder / f"binder-{len(self.binders)}.log").open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "kumiki.binder"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.binders.append(process)
        self.binder_http.append(http)
        if wait_ready:
            await wait_until(lambda: readiness(http)[0] == "ready", timeout_s=90, what="binder ready")
        return process

    def kill_binder(self, index: int = -1) -> None:
        process = self.binders[index]
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def stop(self) -> None:
        for process in [*self.binders, self.placement]:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
            for path in sorted(self.folder.glob("*.log"))
        )


def gpu_claims(pods: Iterable[dict[str, Any]]) -> list[tuple[str, str, str, float]]:
    """(node, resource on that node, pod, share) for every bound pod: a whole GPU index is a share of 1, a MIG
    slice "<gpu>:<profile>@<slot>" of 1, a fraction its share of the GPU."""
    claims = []
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            continue
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        name = pod["metadata"]["name"]
        indices = [part for part in annotations.get(core.GPU_INDICES_ANNOTATION, "").split(",") if part]
        if annotations.get(core.MIG_SLICE_ANNOTATION):
            claims.append((node, f"mig:{indices[0]}:{annotations[core.MIG_SLICE_ANNOTATION]}", name, 1.0))
        elif core.GPU_FRACTION_ANNOTATION in annotations and indices:
            claims.append((node, f"gpu:{indices[0]}", name, float(annotations[core.GPU_FRACTION_ANNOTATION])))
        else:
            claims.extend((node, f"gpu:{index}", name, 1.0) for index in indices)
    return claims


def over_commits(pods: Iterable[dict[str, Any]]) -> list[str]:
    """Any GPU, MIG slot or share held more than once (empty: none)."""
    held: dict[tuple[str, str], float] = {}
    owners: dict[tuple[str, str], list[str]] = {}
    for node, resource, pod, share in gpu_claims(pods):
        held[(node, resource)] = held.get((node, resource), 0.0) + share
        owners.setdefault((node, resource), []).append(pod)
    return [
        f"{node} {resource}: {owners[(node, resource)]}"
        for (node, resource), total in held.items()
        if total > 1.0 + 1e-9
    ]


REVIEWER_RULES = [  # what kumiki.common.kube_tokens calls, nothing more: the chart grants the same two
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
]


async def reviewer_kubeconfig(client: AsyncClient, stack: KubeStack, folder: Path, run: str, account: str) -> Path:
    """A kubeconfig for service account `account` (in namespace kumiki-<run>) bound to a ClusterRole with only
    what reviewing pods' tokens needs."""
    system = f"kumiki-{run}"
    with contextlib.suppress(ApiError):  # a second reviewer of the same run shares the namespace
        await client.create(Namespace.from_dict({"metadata": {"name": system}}))
    await client.create(ServiceAccount.from_dict({"metadata": {"name": account, "namespace": system}}))
    role = f"{account}-{run}"
    await client.create(ClusterRole.from_dict({"metadata": {"name": role}, "rules": REVIEWER_RULES}))
    await client.create(
        ClusterRoleBinding.from_dict(
            {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": system}],
            }
        )
    )
    token = await pod_token(client, system, None, audience=None, account=account)
    config = json.loads(stack.kubeconfig.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token}}]
    path = folder / f"{account}.kubeconfig"
    path.write_text(json.dumps(config))
    await granted(path, REVIEWER_RULES)
    return path


async def granted(kubeconfig: Path, rules: Iterable[dict[str, list[str]]]) -> None:
    """Wait until the API server takes the kubeconfig's credentials and its authorizer grants every rule, asked
    as that user (SelfSubjectAccessReview). A new service account and binding reach the authenticator's and
    the RBAC authorizer's informers a moment after the write; a request in that moment is refused (seen in CI
    as a TokenReview answered UNAVAILABLE)."""
    from kumiki.binder.adapters.kube import client_from

    reviews = [
        SelfSubjectAccessReview(
            spec=SelfSubjectAccessReviewSpec(
                resourceAttributes=ResourceAttributes(group=rule["apiGroups"][0], resource=resource, verb=verb)
            )
        )
        for rule in rules
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]
    client = client_from(kubeconfig)

    async def allowed() -> bool:
        for review in reviews:
            try:
                answer = await client.create(review)
            except ApiError:  # the credentials are not taken yet
                return False
            if answer.status is None or not answer.status.allowed:
                return False
        return True

    try:
        await wait_until(allowed, timeout_s=30, what=f"the API server granting {kubeconfig.name} its rules")
    finally:
        await client.close()


async def pod_token(client: AsyncClient, namespace: str, pod: Any, *, audience: str | None, account: str) -> str:
    """What the kubelet writes into `pod`'s projected serviceAccountToken volume for `audience` (pod None: a
    token bound to no pod; audience None: the API server's own)."""
    bound = None
    if pod is not None:
        bound = BoundObjectReference(kind="Pod", apiVersion="v1", name=pod.metadata.name, uid=pod.metadata.uid)
    request = ServiceAccount.Token(
        metadata=ObjectMeta(),
        spec=TokenRequestSpec(audiences=[] if audience is None else [audience], expirationSeconds=3600,
                              boundObjectRef=bound),
    )  # fmt: skip
    answer = await client.create(request, name=account, namespace=namespace)
    assert answer.status is not None
    return str(answer.status.token)
