"""The labels, annotations and resource names Kumiki reads on pods and nodes and writes on them: one place,
so the binder, the replay driver and the tests spell them alike."""

from __future__ import annotations

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
# a requested run time ("3600", "90m", "1h30m"): a forecasting feature and a cap on the forecast, as
# spec.activeDeadlineSeconds is (the smaller of the two counts)
TIME_LIMIT_ANNOTATION = "kumiki.io/time-limit"
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
# the topology annotation's words -> the scheduling core's levels (kumiki.sched.jobs.TOPOLOGY_LEVELS)
TOPOLOGY_LEVELS = {
    "nvlink-island": "nvlink_island",
    "node": "node",
    "rack": "rack",
}
