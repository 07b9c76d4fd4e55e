"""The binder's pure core: Kubernetes objects (as the API's JSON dicts) in, Kumiki requests and decisions out.

No I/O and no asyncio here: the adapters watch the API server and talk to Placement, and hand every object to
these functions. What a pod asks for is read the way users write it (`nvidia.com/gpu`, MIG resources such as
`nvidia.com/mig-1g.10gb`, a GPU fraction and GPU memory by annotation, CPU and memory requests); nodes become
`Node` values (their `NodeState` records, merged with telemetry's view, are built in `adapters.convert`);
gangs come from the scheduler-plugins PodGroup CRD (`scheduling.x-k8s.io/v1alpha1`, `minMember`) or the
`scheduling.x-k8s.io/pod-group` label.

No kumiki.v1 messages either: a pod's request is the scheduling core's `PodRequest` (kumiki.sched.jobs), its
topology a `Topology`, Placement's answers `PodAssignment` and `PendingReason` values; `adapters.convert` turns
them into kumiki.v1 messages and back.

One module per concept, each importing only those before it: `names` (labels, annotations, resource names),
`quantities` (Kubernetes quantities, PodSpecError), `nodes` (a Node, its taints),
`node_rules` (nodeSelector, required affinity, tolerations, the nodes Placement is told), `capacity` (why a pod
could never fit), `requests` (what a pod asks for), `pod_affinity` (required pod affinity and anti-affinity,
resolved against the placed pods and between a gang's own pods; preferred terms read), `topology_spread`
(topology spread constraints; DoNotSchedule ones resolved the same way), `preferences` (preferred node and pod
affinity, ScheduleAnyway spread and PreferNoSchedule taints as a score per node, as kube-scheduler scores),
`pods` (a Pod, `parse_pod`, `pod_filter`, `pod_scores`), `gangs` (readiness, the BindRequest, a gang's outcome,
replacements for members gone), `writeback` (the Binding's annotations, the PodScheduled reason).
This package re-exports all of their public names, so `core.Name` works whichever module holds it.
"""

from __future__ import annotations

from kumiki.binder.core.capacity import (
    ClusterCapacity,
    capacity_changed,
    never_fits,
)
from kumiki.binder.core.gangs import (
    Gang,
    GangOutcome,
    bind_request_fields,
    gang_outcome,
    replacements,
    same_requests,
)
from kumiki.binder.core.names import (
    GENERATION_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    GPU_INDICES_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    GPU_MODEL_ANNOTATION,
    GPU_MODEL_SELECTOR,
    GPU_RESOURCE,
    GPU_UUIDS_ANNOTATION,
    JOB_ANNOTATION,
    MIG_RESOURCE_PREFIX,
    MIG_SLICE_ANNOTATION,
    NODE_GPU_UUIDS_ANNOTATION,
    NODE_ISLAND_SIZE_LABEL,
    NODE_RACK_LABELS,
    NODE_SHARING_LABEL,
    POD_GROUP_API,
    POD_GROUP_LABEL,
    PREEMPTIBLE_LABEL,
    QUEUE_LABEL,
    SCHEDULER_NAME,
    TIME_LIMIT_ANNOTATION,
    TOPOLOGY_ANNOTATION,
    TOPOLOGY_LEVELS,
    TOPOLOGY_REQUIRED_ANNOTATION,
)
from kumiki.binder.core.node_rules import (
    NODE_OPERATORS,
    REQUIRED_AFFINITY,
    NodeChoice,
    NodeRules,
    Requirement,
    Toleration,
    node_choice,
    node_rules,
    with_choice,
)
from kumiki.binder.core.nodes import (
    BLOCKING_EFFECTS,
    Node,
    Taint,
    gpu_model_name,
    node_taints,
    parse_node,
)
from kumiki.binder.core.pod_affinity import (
    HOSTNAME_LABEL,
    AffinityFilter,
    GangAffinity,
    Placed,
    PodAffinityTerm,
    WeightedTerm,
    affinity_filter,
    gang_affinity,
    gang_topology,
    placed_pod,
    pod_affinity,
    preferred_terms,
)
from kumiki.binder.core.pods import (
    COMMAND_MAX_CHARS,
    INT32_MAX,
    Pod,
    PodKey,
    created_unix_s,
    job_id_for,
    parse_pod,
    pod_command,
    pod_filter,
    pod_image,
    pod_scores,
)
from kumiki.binder.core.preferences import (
    Preferences,
    node_scores,
    preferences,
)
from kumiki.binder.core.quantities import (
    MIB,
    PodSpecError,
    quantity,
)
from kumiki.binder.core.requests import (
    Topology,
    parse_duration_s,
    pod_requests,
    pod_resources,
    time_limit_of,
    topology_of,
)
from kumiki.binder.core.topology_spread import (
    SpreadConstraint,
    gang_spread,
    spread_constraints,
    spread_filter,
)
from kumiki.binder.core.writeback import (
    PendingReason,
    PodAssignment,
    assignment_annotations,
    reason_text,
)

__all__ = [
    "BLOCKING_EFFECTS",
    "COMMAND_MAX_CHARS",
    "GENERATION_ANNOTATION",
    "GPU_FRACTION_ANNOTATION",
    "GPU_INDICES_ANNOTATION",
    "GPU_MEMORY_ANNOTATION",
    "GPU_MODEL_ANNOTATION",
    "GPU_MODEL_SELECTOR",
    "GPU_RESOURCE",
    "GPU_UUIDS_ANNOTATION",
    "HOSTNAME_LABEL",
    "INT32_MAX",
    "JOB_ANNOTATION",
    "MIB",
    "MIG_RESOURCE_PREFIX",
    "MIG_SLICE_ANNOTATION",
    "NODE_GPU_UUIDS_ANNOTATION",
    "NODE_ISLAND_SIZE_LABEL",
    "NODE_OPERATORS",
    "NODE_RACK_LABELS",
    "NODE_SHARING_LABEL",
    "POD_GROUP_API",
    "POD_GROUP_LABEL",
    "PREEMPTIBLE_LABEL",
    "QUEUE_LABEL",
    "REQUIRED_AFFINITY",
    "SCHEDULER_NAME",
    "TIME_LIMIT_ANNOTATION",
    "TOPOLOGY_ANNOTATION",
    "TOPOLOGY_LEVELS",
    "TOPOLOGY_REQUIRED_ANNOTATION",
    "AffinityFilter",
    "ClusterCapacity",
    "Gang",
    "GangAffinity",
    "GangOutcome",
    "Node",
    "NodeChoice",
    "NodeRules",
    "PendingReason",
    "Placed",
    "Pod",
    "PodAffinityTerm",
    "PodAssignment",
    "PodKey",
    "PodSpecError",
    "Preferences",
    "Requirement",
    "SpreadConstraint",
    "Taint",
    "Toleration",
    "Topology",
    "WeightedTerm",
    "affinity_filter",
    "assignment_annotations",
    "bind_request_fields",
    "capacity_changed",
    "created_unix_s",
    "gang_affinity",
    "gang_outcome",
    "gang_spread",
    "gang_topology",
    "gpu_model_name",
    "job_id_for",
    "never_fits",
    "node_choice",
    "node_rules",
    "node_scores",
    "node_taints",
    "parse_duration_s",
    "parse_node",
    "parse_pod",
    "placed_pod",
    "pod_affinity",
    "pod_command",
    "pod_filter",
    "pod_image",
    "pod_requests",
    "pod_resources",
    "pod_scores",
    "preferences",
    "preferred_terms",
    "quantity",
    "reason_text",
    "replacements",
    "same_requests",
    "spread_constraints",
    "spread_filter",
    "time_limit_of",
    "topology_of",
    "with_choice",
]
