"""The binder's pure core: Kubernetes objects (as the API's JSON dicts) in, Kumiki requests and decisions out.

No I/O and no asyncio here: the adapters watch the API server and talk to Placement, and hand every object to
these functions. What a pod asks for is read the way users write it (`nvidia.com/gpu`, MIG resources such as
`nvidia.com/mig-1g.10gb`, a GPU fraction and GPU memory by annotation, CPU and memory requests); nodes become
`NodeState` records merged with telemetry's view; gangs come from the scheduler-plugins PodGroup CRD
(`scheduling.x-k8s.io/v1alpha1`, `minMember`) or the `scheduling.x-k8s.io/pod-group` label.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kumiki.common.contracts.v1 import common_pb2, events_pb2

SCHEDULER_NAME = "kumiki"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
POD_GROUP_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
QUEUE_LABEL = "kumiki.io/queue"
PREEMPTIBLE_LABEL = "kumiki.io/preemptible"
GPU_FRACTION_ANNOTATION = "kumiki.io/gpu-fraction"
GPU_MEMORY_ANNOTATION = "kumiki.io/gpu-memory"  # a quantity ("20Gi") or MiB ("20480")
TOPOLOGY_ANNOTATION = "kumiki.io/topology"  # nvlink-island, node, rack
TOPOLOGY_REQUIRED_ANNOTATION = "kumiki.io/topology-required"  # "true": never break the level
GPU_MODEL_SELECTOR = "nvidia.com/gpu.product"  # nodeSelector (or the kumiki.io/gpu-model annotation)
GPU_MODEL_ANNOTATION = "kumiki.io/gpu-model"
# written on the pod through its Binding (the API server copies a Binding's annotations onto the pod in the
# same write that sets spec.nodeName): what a device plugin or DRA driver on the node reads
JOB_ANNOTATION = "kumiki.io/job"
GENERATION_ANNOTATION = "kumiki.io/generation"
GPU_INDICES_ANNOTATION = "kumiki.io/gpu-indices"
GPU_UUIDS_ANNOTATION = "kumiki.io/gpu-uuids"
MIG_SLICE_ANNOTATION = "kumiki.io/mig-slice"
NODE_GPU_UUIDS_ANNOTATION = "kumiki.io/gpu-uuids"  # on a Node: comma-separated UUIDs by index
NODE_ISLAND_SIZE_LABEL = "kumiki.io/nvlink-island-size"
NODE_SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"  # time-slicing or mps: fractions allowed
NODE_RACK_LABELS = ("kumiki.io/rack", "topology.kubernetes.io/rack", "topology.kubernetes.io/zone")
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
TOPOLOGY_LEVELS = {
    "nvlink-island": common_pb2.TOPOLOGY_LEVEL_NVLINK_ISLAND,
    "node": common_pb2.TOPOLOGY_LEVEL_NODE,
    "rack": common_pb2.TOPOLOGY_LEVEL_RACK,
}
INT32_MAX = 2**31 - 1
MIB = 1024 * 1024


class PodSpecError(ValueError):
    """A pod that cannot be turned into a request; the message names the field (shown on the pod)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where


# ---- quantities ---------------------------------------------------------------------------------------

_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_QUANTITY = re.compile(r"^([+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


def quantity(value: object, where: str) -> float:
    """A Kubernetes resource quantity ("500m", "2", "1.5Gi") as a plain number."""
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if match is None:
        raise PodSpecError(where, f"not a quantity: {text!r}")
    number = float(match.group(1)) * _SUFFIX[match.group(2) or ""]
    if not math.isfinite(number):
        raise PodSpecError(where, f"not a finite quantity: {text!r}")
    return number


# ---- pods -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Pod:
    """What the binder needs of one pod."""

    key: PodKey
    uid: str
    group: str  # PodGroup name, or "" for a pod that is its own gang
    node: str  # spec.nodeName ("" while unbound)
    phase: str
    deleting: bool
    resources: common_pb2.PodResources | None  # None when the pod's request is invalid (see `invalid`)
    invalid: str
    queue: str
    priority: int
    preemptible: bool
    topology: common_pb2.TopologyConstraint
    job_annotation: str  # kumiki.io/job written at bind time ("" before)
    generation_annotation: int
    created_unix_s: float = 0.0  # metadata.creationTimestamp (whole seconds; 0: absent or unreadable)
    rules: NodeRules = field(default_factory=lambda: NodeRules())  # nodeSelector, node affinity, tolerations

    @property
    def job_id(self) -> str:
        return job_id_for(self.key.namespace, self.group, self.key.name)

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


def job_id_for(namespace: str, group: str, pod_name: str) -> str:
    """A gang's job id: `<namespace>/<podgroup>`; a pod without a group is `<namespace>/pod/<pod>`."""
    return f"{namespace}/{group}" if group else f"{namespace}/pod/{pod_name}"


def _container_requests(container: Mapping[str, Any], index: int, kind: str) -> dict[str, float]:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {})
    requests.update(resources.get("requests") or {})  # requests win; limits stand in for extended resources
    out: dict[str, float] = {}
    for name, value in requests.items():
        out[name] = quantity(value, f"spec.{kind}[{index}].resources.requests[{name}]")
    return out


def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """Effective requests: the sum over containers, at least each init container's (as kube-scheduler does)."""
    total: dict[str, float] = {}
    for index, container in enumerate(spec.get("containers") or []):
        for name, value in _container_requests(container, index, "containers").items():
            total[name] = total.get(name, 0.0) + value
    for index, container in enumerate(spec.get("initContainers") or []):
        for name, value in _container_requests(container, index, "initContainers").items():
            total[name] = max(total.get(name, 0.0), value)
    return total


def pod_resources(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> common_pb2.PodResources:
    """The request of one pod, validated: exactly one GPU form (whole GPUs, one MIG slice, a fraction)."""
    requests = pod_requests(spec)
    annotations = metadata.get("annotations") or {}
    resources = common_pb2.PodResources(
        cpu_milli=math.ceil(requests.get("cpu", 0.0) * 1000),
        memory_mib=math.ceil(requests.get("memory", 0.0) / MIB),
    )
    gpus = requests.get(GPU_RESOURCE, 0.0)
    if gpus != int(gpus) or gpus < 0:
        raise PodSpecError(f"resources[{GPU_RESOURCE}]", f"must be a whole number, got {gpus:g}")
    resources.gpus = int(gpus)
    migs = {
        name[len(MIG_RESOURCE_PREFIX) :]: value
        for name, value in requests.items()
        if name.startswith(MIG_RESOURCE_PREFIX)
    }
    migs = {profile: value for profile, value in migs.items() if value > 0}
    if migs:
        if len(migs) > 1 or next(iter(migs.values())) != 1:
            raise PodSpecError(f"resources[{MIG_RESOURCE_PREFIX}*]", f"exactly one MIG slice per pod, got {migs}")
        resources.mig_profile = next(iter(migs))
    fraction_text = annotations.get(GPU_FRACTION_ANNOTATION)
    if fraction_text is not None:
        try:
            fraction = float(fraction_text)
        except ValueError:
            raise PodSpecError(GPU_FRACTION_ANNOTATION, f"not a number: {fraction_text!r}") from None
        if not (math.isfinite(fraction) and 0 < fraction < 1):
            raise PodSpecError(GPU_FRACTION_ANNOTATION, f"must be within (0, 1), got {fraction_text}")
        resources.gpu_fraction = fraction
    memory_text = annotations.get(GPU_MEMORY_ANNOTATION)
    if memory_text is not None:
        text = str(memory_text).strip()
        mib = float(text) if text.isdigit() else quantity(text, GPU_MEMORY_ANNOTATION) / MIB
        if mib <= 0:
            raise PodSpecError(GPU_MEMORY_ANNOTATION, f"must be positive, got {memory_text!r}")
        resources.gpu_memory_mib = math.ceil(mib)
    forms = (resources.gpus > 0) + bool(resources.mig_profile) + (resources.gpu_fraction > 0)
    if forms > 1:
        raise PodSpecError("resources", "ask for only one of nvidia.com/gpu, a MIG resource, a GPU fraction")
    if resources.gpu_fraction > 0 and resources.gpu_memory_mib == 0:
        raise PodSpecError(GPU_MEMORY_ANNOTATION, f"required with {GPU_FRACTION_ANNOTATION} (the per-card memory cap)")
    if resources.gpus > 64:
        raise PodSpecError(f"resources[{GPU_RESOURCE}]", f"at most 64 GPUs per pod, got {resources.gpus}")
    model = annotations.get(GPU_MODEL_ANNOTATION) or (spec.get("nodeSelector") or {}).get(GPU_MODEL_SELECTOR)
    if model:
        resources.gpu_model = gpu_model_name(str(model))
    return resources


_MODEL = re.compile(r"\b([A-Z]+[0-9]+[A-Z]?)\b")
_MEMORY = re.compile(r"([0-9]+)GB")


def gpu_model_name(product: str, memory_mib: int = 0) -> str:
    """gpu-feature-discovery's product label ("NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3") as Kumiki's
    model names ("A100-80GB", "H100-80GB": what MIG profiles and the simulator know); unknown forms unchanged."""
    text = product.upper().removeprefix("NVIDIA-").replace("_", "-")
    family = _MODEL.search(text.replace("-", " "))
    if family is None:
        return product
    memory = _MEMORY.search(text)
    gb = int(memory.group(1)) if memory else round(memory_mib / 1024) if memory_mib else 0
    return f"{family.group(1)}-{gb}GB" if gb else family.group(1)


def topology_of(annotations: Mapping[str, str]) -> common_pb2.TopologyConstraint:
    level_text = annotations.get(TOPOLOGY_ANNOTATION)
    if not level_text:
        return common_pb2.TopologyConstraint()
    level = TOPOLOGY_LEVELS.get(level_text)
    if level is None:
        raise PodSpecError(TOPOLOGY_ANNOTATION, f"expected one of {', '.join(TOPOLOGY_LEVELS)}, got {level_text!r}")
    required = annotations.get(TOPOLOGY_REQUIRED_ANNOTATION, "false").lower() == "true"
    return common_pb2.TopologyConstraint(level=level, required=required)


def created_unix_s(metadata: Mapping[str, Any]) -> float:
    """metadata.creationTimestamp (RFC 3339, whole seconds) as Unix seconds; 0.0 when absent or unreadable, so
    a pod the API server stamped oddly is bound all the same and only left out of the latency histogram."""
    raw = metadata.get("creationTimestamp")
    if not isinstance(raw, str) or not raw:
        return 0.0
    try:
        stamp = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return stamp.timestamp() if stamp.tzinfo is not None else 0.0


def parse_pod(obj: Mapping[str, Any], known: Pod | None = None) -> Pod:
    """A pod as the API returns it. Never raises for a bad request: the pod is kept with `invalid` set, so
    the binder can tell the user on the pod itself. `known`: the same pod (same uid) as read before, whose
    request is taken as it was (a pod's spec does not change; each of its watch events need not re-read it)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    namespace = str(metadata.get("namespace") or "default")
    uid = str(metadata.get("uid") or "")
    invalid = ""
    resources: common_pb2.PodResources | None = None
    topology = common_pb2.TopologyConstraint()
    rules = NodeRules()
    if known is not None and uid and known.uid == uid:
        resources, invalid, topology, rules = known.resources, known.invalid, known.topology, known.rules
    else:
        try:
            resources = pod_resources(metadata, spec)
            topology = topology_of(annotations)
            rules = node_rules(spec)
        except PodSpecError as error:
            invalid = str(error)
            resources = None
    try:
        generation = int(annotations.get(GENERATION_ANNOTATION) or 0)
    except ValueError:
        generation = 0
    priority = spec.get("priority")
    return Pod(
        key=PodKey(namespace, str(metadata.get("name") or "")),
        uid=uid,
        group=str(labels.get(POD_GROUP_LABEL) or ""),
        node=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=metadata.get("deletionTimestamp") is not None,
        resources=resources,
        invalid=invalid,
        queue=str(labels.get(QUEUE_LABEL) or namespace),
        priority=max(-INT32_MAX, min(INT32_MAX, int(priority))) if isinstance(priority, int) else 0,
        preemptible=str(labels.get(PREEMPTIBLE_LABEL) or "").lower() == "true",
        topology=topology,
        job_annotation=str(annotations.get(JOB_ANNOTATION) or ""),
        generation_annotation=generation,
        created_unix_s=created_unix_s(metadata),
        rules=rules,
    )


# ---- nodes ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    """A node as the API describes it."""

    name: str
    gpus: int
    gpu_model: str
    gpu_memory_mib: int
    mig: bool
    shareable: bool
    island_size: int
    rack: str
    cpu_milli: int
    memory_mib: int
    schedulable: bool  # not cordoned and Ready
    why_not: str
    gpu_uuids: tuple[str, ...]
    labels: Mapping[str, str]
    version: int
    taints: tuple[Taint, ...] = ()


def parse_node(obj: Mapping[str, Any]) -> Node:
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = {str(key): str(value) for key, value in (metadata.get("labels") or {}).items()}
    annotations = metadata.get("annotations") or {}
    name = str(metadata.get("name") or "")
    allocatable = status.get("allocatable") or status.get("capacity") or {}

    def number(key: str, default: float = 0.0) -> float:
        try:
            return quantity(allocatable[key], f"status.allocatable[{key}]") if key in allocatable else default
        except PodSpecError:
            return default

    mig = any(key.startswith(MIG_RESOURCE_PREFIX) and number(key) > 0 for key in allocatable)
    gpus = int(number(GPU_RESOURCE))
    count_label = labels.get("nvidia.com/gpu.count", "")
    if count_label.isdigit() and (mig or gpus == 0):
        gpus = int(count_label)  # in MIG mode the whole GPUs are not advertised as nvidia.com/gpu
    memory_label = labels.get("nvidia.com/gpu.memory", "")
    island_label = labels.get(NODE_ISLAND_SIZE_LABEL, "")
    island = int(island_label) if island_label.isdigit() and int(island_label) > 0 else gpus
    rack = next((labels[key] for key in NODE_RACK_LABELS if labels.get(key)), "")
    ready = any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )
    cordoned = bool(spec.get("unschedulable"))
    why_not = "cordoned (spec.unschedulable)" if cordoned else ("" if ready else "not Ready")
    uuids = tuple(
        part.strip() for part in str(annotations.get(NODE_GPU_UUIDS_ANNOTATION) or "").split(",") if part.strip()
    )
    version_text = str(metadata.get("resourceVersion") or "0")
    return Node(
        name=name,
        gpus=gpus,
        gpu_model=gpu_model_name(labels[GPU_MODEL_SELECTOR], int(memory_label) if memory_label.isdigit() else 0)
        if labels.get(GPU_MODEL_SELECTOR)
        else ("gpu" if gpus else ""),
        gpu_memory_mib=int(memory_label) if memory_label.isdigit() else 0,
        mig=mig,
        shareable=labels.get(NODE_SHARING_LABEL, "") in ("time-slicing", "mps")
        or labels.get("kumiki.io/gpu-sharing") == "true",
        island_size=max(1, min(island, gpus)) if gpus else 1,
        rack=rack,
        cpu_milli=int(number("cpu") * 1000),
        memory_mib=int(number("memory") / MIB),
        schedulable=not why_not,
        why_not=why_not,
        gpu_uuids=uuids,
        labels=labels,
        version=int(version_text) if version_text.isdigit() else 0,
        taints=node_taints(spec),
    )


def node_state(node: Node, telemetry: events_pb2.NodeState | None = None) -> events_pb2.NodeState:
    """The record placement reads for a node: the API's inventory (or telemetry's GPUs when it has seen the
    node), healthy only when telemetry says so AND the API has it schedulable and Ready."""
    if telemetry is not None and telemetry.gpus:
        gpus = [events_pb2.GpuState() for _ in telemetry.gpus]
        for copy, gpu in zip(gpus, telemetry.gpus, strict=True):
            copy.CopyFrom(gpu)
    else:
        gpus = [
            events_pb2.GpuState(
                index=index,
                uuid=node.gpu_uuids[index] if index < len(node.gpu_uuids) else "",
                model=node.gpu_model,
                memory_mib=node.gpu_memory_mib,
                nvlink_island=index // node.island_size,
                mig_enabled=node.mig,
                healthy=True,
                shareable=node.shareable,
            )
            for index in range(node.gpus)
        ]
    healthy = node.schedulable and (telemetry.healthy if telemetry is not None else True)
    labels = dict(telemetry.labels) if telemetry is not None else {}
    labels.update({key: value for key, value in node.labels.items() if len(key) < 128})
    labels["kumiki.io/source"] = "kubernetes"
    return events_pb2.NodeState(
        node=node.name,
        rack=(telemetry.rack if telemetry is not None and telemetry.rack else node.rack),
        gpus=gpus,
        cpu_milli=node.cpu_milli,
        memory_mib=node.memory_mib,
        healthy=healthy,
        version=common_pb2.EntityVersion(version=node.version),
        labels=labels,
    )


def same_node_state(a: events_pb2.NodeState, b: events_pb2.NodeState) -> bool:
    """Equal apart from the version and observation time (what makes a republication worth it)."""
    left, right = events_pb2.NodeState(), events_pb2.NodeState()
    left.CopyFrom(a)
    right.CopyFrom(b)
    for message in (left, right):
        message.ClearField("version")
        message.ClearField("last_seen")
    return left == right


# ---- gangs ----------------------------------------------------------------------------------------------


@dataclass
class Gang:
    """The pods of one job (a PodGroup, or a pod alone) and where its scheduling stands."""

    job_id: str
    namespace: str
    group: str
    min_member: int = 0  # from the PodGroup (0: no PodGroup object seen)
    pods: dict[PodKey, Pod] = field(default_factory=dict)
    generation: int = 0  # the last generation submitted (0: never)
    submitted: tuple[PodKey, ...] = ()  # the pods of the request, in its order
    bound: bool = False
    running_published: int = 0  # generation whose RUNNING was published
    released: int = 0  # generation released in placement
    reason: str = ""  # the last pending reason shown on the pods
    last_join: float = 0.0  # monotonic time the last pod joined (a group without a PodGroup settles first)
    timeout_s: int = 0  # the PodGroup's scheduleTimeoutSeconds (0: none)
    waiting_since: float = 0.0  # monotonic time of the first submission of the unbound gang (0: none)
    timed_out: bool = False  # scheduleTimeoutSeconds passed: not submitted again until its pods or group change

    def waiting_count(self) -> int:
        return sum(1 for pod in self.pods.values() if not pod.node and not pod.deleting and not pod.ended)

    def waiting(self) -> list[Pod]:
        return sorted(
            (pod for pod in self.pods.values() if not pod.node and not pod.deleting and not pod.ended),
            key=lambda pod: pod.key.name,
        )

    def ready_to_submit(self) -> bool:
        """A PodGroup waits for minMember pods; a pod alone (or a labelled group without a PodGroup) goes now."""
        waiting = self.waiting()
        if not waiting:
            return False
        if self.group and self.min_member:
            return len(waiting) >= self.min_member
        return True


def bind_request_fields(gang: Gang, pods: Sequence[Pod]) -> dict[str, Any]:
    """The fields of the BindRequest for `pods` (all of them valid), in request order."""
    first = pods[0]
    return {
        "queue": first.queue,
        "pods": [pod.resources for pod in pods],
        "min_members": min(gang.min_member, len(pods)) if gang.group and gang.min_member else 0,
        "topology": first.topology,
        "priority_tier": max(pod.priority for pod in pods),
        "preemptible": all(pod.preemptible for pod in pods),
        "name": gang.group or first.key.name,
    }


def assignment_annotations(
    job_id: str, generation: int, assignment: common_pb2.PodAssignment, node: Node | None
) -> dict[str, str]:
    """What the pod carries once bound: its job, generation, GPU indices and UUIDs, MIG slice, fraction."""
    annotations = {JOB_ANNOTATION: job_id, GENERATION_ANNOTATION: str(generation)}
    if assignment.gpu_indices:
        annotations[GPU_INDICES_ANNOTATION] = ",".join(str(index) for index in assignment.gpu_indices)
        if node is not None and node.gpu_uuids:
            uuids = [node.gpu_uuids[index] for index in assignment.gpu_indices if index < len(node.gpu_uuids)]
            if len(uuids) == len(assignment.gpu_indices):
                annotations[GPU_UUIDS_ANNOTATION] = ",".join(uuids)
    if assignment.mig_slice:
        annotations[MIG_SLICE_ANNOTATION] = assignment.mig_slice
    if assignment.gpu_fraction:
        annotations[GPU_FRACTION_ANNOTATION] = f"{assignment.gpu_fraction:g}"
    return annotations


def reason_text(reasons: Iterable[common_pb2.PendingReason], queue_position: int = 0) -> tuple[str, str]:
    """(Reason, message) for the PodScheduled=False condition, from Placement's structured reasons."""
    parts = []
    code = "Unschedulable"
    for reason in reasons:
        text = reason.message or reason.code  # Placement's message already names resource and shape
        parts.append(text)
        if reason.code == "quota_exceeded":
            code = "QuotaExceeded"
        elif reason.code in ("never_fits", "no_node_can_hold", "unsatisfiable"):
            code = "NeverFits"
    if queue_position:
        parts.append(f"position {queue_position} in its queue")
    return code, "; ".join(parts) or "waiting for placement"


def never_fits(resources: common_pb2.PodResources, nodes: Iterable[Node]) -> str:
    """Why no node in the cluster, even empty, could ever hold this pod ("" when some node could)."""
    return ClusterCapacity.of(nodes).never_fits(resources)


@dataclass(frozen=True, slots=True)
class ClusterCapacity:
    """The largest shapes among the schedulable nodes, computed once per node change: `never_fits` for each
    pod of a stream of thousands must not walk every node."""

    nodes: int
    gpus: int
    mig: bool
    shareable: bool
    models: frozenset[str]
    cpu_milli: int
    memory_mib: int
    tainted: bool = False  # some node has a NoSchedule / NoExecute taint: every pod's rules must be checked

    @classmethod
    def of(cls, nodes: Iterable[Node]) -> ClusterCapacity:
        candidates = list(nodes)
        return cls(
            nodes=len(candidates),
            gpus=max((node.gpus for node in candidates), default=0),
            mig=any(node.mig for node in candidates),
            shareable=any(node.shareable for node in candidates),
            models=frozenset(node.gpu_model for node in candidates),
            cpu_milli=max((node.cpu_milli for node in candidates), default=0),
            memory_mib=max((node.memory_mib for node in candidates), default=0),
            tainted=any(taint.effect in BLOCKING_EFFECTS for node in candidates for taint in node.taints),
        )

    def never_fits(self, resources: common_pb2.PodResources) -> str:
        """Why no node in the cluster, even empty, could ever hold this pod ("" when some node could)."""
        if not self.nodes:
            return "no nodes in the cluster"
        if resources.gpus > self.gpus:
            return f"asks for {resources.gpus} GPUs; the largest node has {self.gpus}"
        if resources.mig_profile and not self.mig:
            return f"asks for MIG slice {resources.mig_profile}; no node is in MIG mode"
        if resources.gpu_fraction and not self.shareable:
            return "asks for a GPU fraction; no node shares its GPUs"
        if resources.gpu_model and resources.gpu_model not in self.models:
            return f"asks for GPU model {resources.gpu_model}; no node has it"
        if resources.cpu_milli > self.cpu_milli:
            return f"asks for {resources.cpu_milli}m CPU; the largest node has {self.cpu_milli}m"
        if resources.memory_mib > self.memory_mib:
            return f"asks for {resources.memory_mib} MiB memory; the largest node has {self.memory_mib} MiB"
        return ""


def capacity_changed(before: Node, after: Node) -> bool:
    """Whether a node's change can change the cluster's ClusterCapacity (a heartbeat does not)."""
    return before.taints != after.taints or (
        before.schedulable,
        before.gpus,
        before.mig,
        before.shareable,
        before.gpu_model,
        before.cpu_milli,
        before.memory_mib,
    ) != (after.schedulable, after.gpus, after.mig, after.shareable, after.gpu_model, after.cpu_milli, after.memory_mib)


# ---- node rules: taints and tolerations, nodeSelector, required node affinity --------------------------

REQUIRED_AFFINITY = "requiredDuringSchedulingIgnoredDuringExecution"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule is a preference: never a reason to refuse


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str  # "" with Exists: every taint
    operator: str  # Equal or Exists
    value: str
    effect: str  # "" : every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions (or matchFields on metadata.name) entry of a node selector term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...]
    field: bool = False  # matchFields: the key is metadata.name

    def matches(self, labels: Mapping[str, str], name: str) -> bool:
        value = name if self.field else labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        if value is None or not self.values:
            return False
        try:  # Gt / Lt compare integers
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.operator == "Gt" else number < bound


NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


@dataclass(frozen=True, slots=True)
class NodeRules:
    """Where a pod may run: every nodeSelector label, one of the required affinity terms (each term all its
    requirements; no terms: any node), and a toleration for every NoSchedule / NoExecute taint."""

    selector: tuple[tuple[str, str], ...] = ()
    terms: tuple[tuple[Requirement, ...], ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def restricts(self) -> bool:
        """Whether anything but taints can exclude a node."""
        return bool(self.selector or self.terms)

    def admits(self, node: Node) -> bool:
        return self.why_not(node) == ""

    def why_not(self, node: Node) -> str:
        """ "" when the pod may run on the node, else what excludes it (in kube-scheduler's words)."""
        for key, value in self.selector:
            if node.labels.get(key) != value:
                return "node(s) didn't match Pod's node affinity/selector"
        if self.terms and not any(
            all(requirement.matches(node.labels, node.name) for requirement in term) for term in self.terms
        ):
            return "node(s) didn't match Pod's node affinity/selector"
        for taint in node.taints:
            if taint.effect in BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in self.tolerations):
                return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
        return ""


def node_rules(spec: Mapping[str, Any]) -> NodeRules:
    """A pod's nodeSelector, required node affinity and tolerations, validated (PodSpecError names the field)."""
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        raise PodSpecError("spec.nodeSelector", "must be a map of labels")
    # the GPU model selector is Placement's gpu_model already (pod_resources): not a node list on every pod
    selector = {key: value for key, value in selector.items() if key != GPU_MODEL_SELECTOR}
    terms: list[tuple[Requirement, ...]] = []
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED_AFFINITY) or {}
    for t, term in enumerate(affinity.get("nodeSelectorTerms") or []):
        requirements: list[Requirement] = []
        for kind, is_field in (("matchExpressions", False), ("matchFields", True)):
            for r, expression in enumerate((term or {}).get(kind) or []):
                where = f"spec.affinity.nodeAffinity.{REQUIRED_AFFINITY}.nodeSelectorTerms[{t}].{kind}[{r}]"
                operator = str(expression.get("operator") or "")
                if operator not in NODE_OPERATORS:
                    raise PodSpecError(
                        f"{where}.operator", f"expected one of {', '.join(NODE_OPERATORS)}, got {operator!r}"
                    )
                values = tuple(str(value) for value in expression.get("values") or [])
                if is_field and str(expression.get("key") or "") != "metadata.name":
                    raise PodSpecError(f"{where}.key", "matchFields supports only metadata.name")
                requirements.append(Requirement(str(expression.get("key") or ""), operator, values, is_field))
        terms.append(tuple(requirements))
    tolerations = tuple(
        Toleration(
            str(item.get("key") or ""),
            str(item.get("operator") or "Equal"),
            str(item.get("value") or ""),
            str(item.get("effect") or ""),
        )
        for item in spec.get("tolerations") or []
        if isinstance(item, Mapping)
    )
    return NodeRules(
        tuple(sorted((str(key), str(value)) for key, value in selector.items())), tuple(terms), tolerations
    )


def node_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(item.get("key") or ""), str(item.get("value") or ""), str(item.get("effect") or ""))
        for item in spec.get("taints") or []
        if isinstance(item, Mapping)
    )


@dataclass(frozen=True, slots=True)
class NodeChoice:
    """A pod's node rules resolved against the schedulable nodes: what Placement is told (`nodes`: only these,
    or `avoid`: never these, whichever is shorter), or why no node admits it (`none_because`)."""

    nodes: tuple[str, ...] = ()
    avoid: tuple[str, ...] = ()
    none_because: str = ""


def node_choice(rules: NodeRules, candidates: Sequence[Node], tainted: bool) -> NodeChoice:
    """`candidates`: the schedulable nodes. No rules and no blocking taint anywhere: nothing to check."""
    if not rules.restricts and not tainted:
        return NodeChoice()
    admitted: list[str] = []
    refused: list[str] = []
    first_why = ""
    for node in candidates:
        why = rules.why_not(node)
        if why:
            refused.append(node.name)
            first_why = first_why or why
        else:
            admitted.append(node.name)
    if not admitted:
        return NodeChoice(none_because=f"0/{len(candidates)} nodes admit it: {first_why or 'no nodes'}")
    if not refused:
        return NodeChoice()
    if len(admitted) <= len(refused):
        return NodeChoice(nodes=tuple(sorted(admitted)))
    return NodeChoice(avoid=tuple(sorted(refused)))


def with_choice(resources: common_pb2.PodResources, choice: NodeChoice) -> common_pb2.PodResources:
    """The pod's request as Placement gets it: its resources and its node rules as node names."""
    if not choice.nodes and not choice.avoid:
        return resources
    out = common_pb2.PodResources()
    out.CopyFrom(resources)
    out.nodes.extend(choice.nodes)
    out.avoid_nodes.extend(choice.avoid)
    return out


def same_requests(logged: Sequence[common_pb2.PodResources], pods: Sequence[common_pb2.PodResources | None]) -> bool:
    """Whether Placement's logged request asks for what these pods ask for (node rules aside: they are
    resolved against the nodes of the moment and change with them)."""
    if len(logged) != len(pods):
        return False
    for before, now in zip(logged, pods, strict=True):
        if now is None:
            return False
        if before.nodes or before.avoid_nodes:
            stripped = common_pb2.PodResources()
            stripped.CopyFrom(before)
            stripped.ClearField("nodes")
            stripped.ClearField("avoid_nodes")
            before = stripped
        if before != now:
            return False
    return True


def gang_outcome(pods: Iterable[Pod]) -> int:
    """How a gang's bound pods ended: COMPLETED when all succeeded, FAILED when any failed, else UNSPECIFIED
    (some still run)."""
    phases = [pod.phase for pod in pods]
    if not phases or not all(phase in ("Succeeded", "Failed") for phase in phases):
        return events_pb2.JOB_STATE_UNSPECIFIED
    return events_pb2.JOB_STATE_FAILED if "Failed" in phases else events_pb2.JOB_STATE_COMPLETED
