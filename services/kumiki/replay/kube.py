"""The replay through Kubernetes: the same trace, clock and checks as the Bind replay (`kumiki.replay.driver`),
but each job is a PodGroup and its pods in a real kube-apiserver, on KWOK nodes with 8 GPUs each. The binder
schedules them through Placement, KWOK runs them and ends them after their trace duration (the
`kumiki.io/run-for` stage, infra/kube/stages), and the binder reports their phases on job.lifecycle.

The driver plays the part a Job controller plays on a real cluster: when the preemption coordinator evicts a
gang (checkpoint, then the Eviction API), it creates the gang's pods again for the next generation with the
run time that is left, as a training operator restarts a job from its checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Namespace, Node, Pod

from kumiki.binder.adapters.kube import PodGroup
from kumiki.binder.core import (
    GPU_RESOURCE,
    NODE_GPU_UUIDS_ANNOTATION,
    NODE_ISLAND_SIZE_LABEL,
    POD_GROUP_LABEL,
    PREEMPTIBLE_LABEL,
    QUEUE_LABEL,
    SCHEDULER_NAME,
)
from kumiki.devstack.kube import FAKE_NODE_ANNOTATION
from kumiki.replay.core import ReplayJob
from kumiki.replay.driver import Replay, _Track

log = logging.getLogger(__name__)

RUN_FOR_ANNOTATION = "kumiki.io/run-for"  # KWOK ends the pod this long after it runs (a Go duration)
REPLAY_LABEL = "kumiki.dev/replay"
GPU_MODEL = "NVIDIA-A100-SXM4-80GB"
GPUS_PER_NODE = 8
KINDS: dict[str, Any] = {"Pod": Pod, "PodGroup": PodGroup, "Node": Node}


def client_for(kubeconfig: Path) -> AsyncClient:
    return AsyncClient(config=KubeConfig.from_file(str(kubeconfig)), field_manager="kumiki-replay")


def node_object(
    name: str, gpus: int = GPUS_PER_NODE, rack: str = "rack-0", *, island: int = GPUS_PER_NODE, pods: int = 256
) -> dict[str, Any]:
    """A KWOK node the way the GPU operator labels a real one (product, memory, count, NVLink island of
    `island` GPUs); the replay's and the scheduling benchmark's nodes."""
    allocatable = {"cpu": "128", "memory": "1024Gi", "pods": str(pods), GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": GPU_MODEL,
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/gpu.count": str(gpus),
                NODE_ISLAND_SIZE_LABEL: str(island),
                "kumiki.io/rack": rack,
                REPLAY_LABEL: "true",
                "type": "kwok",
            },
            "annotations": {
                FAKE_NODE_ANNOTATION: "fake",
                NODE_GPU_UUIDS_ANNOTATION: ",".join(f"GPU-{name}-{index}" for index in range(gpus)),
            },
        },
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


def go_duration(seconds: float) -> str:
    """A Go duration KWOK parses ("1.250s"); never 0, which would end a pod before it ran."""
    return f"{max(0.001, seconds):.3f}s"


def gang_objects(
    namespace: str,
    group: str,
    job: ReplayJob,
    *,
    generation: int,
    run_for_s: float,
    preemptible: bool,
) -> list[dict[str, Any]]:
    """The PodGroup (first generation only) and one pod per trace pod, each asking for its GPUs."""
    objects: list[dict[str, Any]] = []
    if generation == 1:
        objects.append(
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": group, "namespace": namespace, "labels": {REPLAY_LABEL: "true"}},
                "spec": {"minMember": len(job.pods)},
            }
        )
    for index, gpus in enumerate(job.pods):
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{group}-g{generation}-{index}",
                    "namespace": namespace,
                    "labels": {
                        POD_GROUP_LABEL: group,
                        QUEUE_LABEL: job.queue,
                        PREEMPTIBLE_LABEL: "true" if preemptible else "false",
                        REPLAY_LABEL: "true",
                    },
                    "annotations": {RUN_FOR_ANNOTATION: go_duration(run_for_s)},
                },
                "spec": {
                    "schedulerName": SCHEDULER_NAME,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "train",
                            "image": "registry.example/replay:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {GPU_RESOURCE: str(gpus)},
                            },
                        }
                    ],
                },
            }
        )
    return objects


class KubeReplay(Replay):
    """One phase through the API server: namespace `<run>-<phase>`, job `<namespace>/j<index>`."""

    def __init__(self, jobs: Sequence[ReplayJob], *, kubeconfig: Path, **options: Any) -> None:
        super().__init__(jobs, **options)
        self.kubeconfig = kubeconfig
        self.namespace = self.prefix.rstrip("/")
        self._client: Any = None
        self.pods_created = 0

    def job_prefix(self) -> str:
        return f"{self.run_id}-{self.phase}/"

    def key_for(self, index: int, job: ReplayJob) -> str:
        return f"{self.prefix}j{index:05d}"

    def _schedule_end(self, key: str, track: _Track, started_wall: float) -> None:
        """KWOK ends the pods (their run-for); the binder reports COMPLETED and releases the job in Placement."""

    def _ended(self, key: str, track: _Track, generation: int, at_wall: float) -> None:
        if generation != track.generation or not track.running:
            return
        track.executed_s = track.job.duration_s
        self._unhold(key, track, at_wall)
        self._finished(track)

    def _requeued(self, key: str, track: _Track) -> None:
        """The gang was evicted: its next generation's pods, with the run time that is left."""
        remaining_s = max(0.0, track.job.duration_s - track.executed_s)
        self._spawn(self._create(key, track.job, track.generation + 1, remaining_s))

    async def _open(self) -> None:
        self._client = client_for(self.kubeconfig)
        await self._client.create(Namespace.from_dict({"metadata": {"name": self.namespace}}))

    async def _close(self) -> None:
        if self._client is None:
            return
        with contextlib.suppress(Exception):  # KWOK has no namespace controller: pods are deleted by the driver
            await delete_replay_pods(self._client, self.namespace)
            await self._client.delete(Namespace, self.namespace)
        await self._client.close()
        self._client = None

    async def _pods_of(self, key: str) -> list[dict[str, Any]]:
        group = key.rsplit("/", 1)[1]
        pods = self._client.list(Pod, namespace=self.namespace, labels={POD_GROUP_LABEL: group})
        return [pod.to_dict() async for pod in pods]

    async def _submit(self, key: str, track: _Track) -> None:
        self._submitted(track)
        await self._create(key, track.job, 1, track.job.duration_s)

    async def _create(self, key: str, job: ReplayJob, generation: int, remaining_s: float) -> None:
        group = key.rsplit("/", 1)[1]
        objects = gang_objects(
            self.namespace,
            group,
            job,
            generation=generation,
            run_for_s=remaining_s / self.speed,
            preemptible=self.preemptible,
        )
        try:
            for obj in objects:
                await self._client.create(KINDS[obj["kind"]].from_dict(obj))
                self.pods_created += obj["kind"] == "Pod"
        except ApiError as error:
            self.errors.append(f"{key}: create {obj['kind']} {obj['metadata']['name']}: {error.status.message}")


async def create_nodes(kubeconfig: Path, count: int, prefix: str = "kwok-replay") -> list[str]:
    """`count` KWOK nodes of 8 GPUs (16 to a rack), created or left as they are; returns their names."""
    client = client_for(kubeconfig)
    names = [f"{prefix}-{index:05d}" for index in range(count)]
    try:
        for index, name in enumerate(names):
            try:
                node: Node = Node.from_dict(node_object(name, rack=f"rack-{index // 16:04d}"))  # type: ignore[assignment]
                await client.create(node)
            except ApiError as error:
                if error.status.code != 409:  # already there from an earlier replay: the same node
                    raise
    finally:
        await client.close()
    return names


async def delete_nodes(kubeconfig: Path, keep: int = 0, prefix: str = "kwok-replay") -> int:
    """The replay's KWOK nodes beyond the first `keep` go (a smaller replay runs on exactly its cluster)."""
    client = client_for(kubeconfig)
    deleted = 0
    try:
        async for node in client.list(Node, labels={REPLAY_LABEL: "true"}):
            name = str(node.metadata.name if node.metadata else "")
            if name.startswith(prefix) and int(name.rsplit("-", 1)[1]) >= keep:
                with contextlib.suppress(ApiError):
                    await client.delete(Node, name)
                    deleted += 1
    finally:
        await client.close()
    return deleted


async def delete_replay_pods(client: AsyncClient, namespace: str) -> None:
    async for pod in client.list(Pod, namespace=namespace):
        name = str(pod.metadata.name if pod.metadata else "")
        with contextlib.suppress(ApiError):
            await client.delete(Pod, name, namespace=namespace, grace_period=0)
