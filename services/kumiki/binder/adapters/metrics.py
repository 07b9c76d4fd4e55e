"""The binder's Prometheus metrics, in one place (registered once, on import)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BINDS = Counter("kumiki_binder_pods_bound_total", "Pods the binder bound (Binding created)")
GANGS = Counter("kumiki_binder_gangs_total", "Gang submissions by Placement's answer", ["outcome"])
BIND_SECONDS = Histogram(
    "kumiki_binder_gang_bind_seconds",
    "From submitting a gang to the last of its Bindings",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
POD_SCHEDULING_SECONDS = Histogram(
    "kumiki_binder_pod_scheduling_seconds",
    "End-to-end pod scheduling latency: the pod's creationTimestamp (whole seconds) to its Binding created",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
EVICTIONS = Counter("kumiki_binder_evictions_total", "Eviction API calls by result", ["result"])
EVICTIONS_CONFIRMED = Counter(
    "kumiki_binder_evictions_confirmed_total", "Generations the preemption coordinator released as PREEMPTED"
)
PREEMPTION_COMMANDS = Counter(
    "kumiki_binder_preemption_commands_total", "Preemption commands the binder read, by action", ["action"]
)
EVICTIONS_AWAITING_RELEASE = Gauge(
    "kumiki_binder_evictions_awaiting_release",
    "Gangs evicted on an EVICT command whose PREEMPTED release has not been read yet (one that stays is an eviction"
    " the coordinator never released)",
)
REPAIRS = Counter("kumiki_binder_repaired_binds_total", "Binds Placement made that the API had not got, repaired")
PENDING = Gauge("kumiki_binder_pending_pods", "Pods with schedulerName kumiki and no node")
EVENTS_DROPPED = Counter("kumiki_binder_events_dropped_total", "Kubernetes Events not sent (queue full)")
REASONS_REFRESHED = Counter(
    "kumiki_binder_pending_reasons_refreshed_total",
    "Waiting gangs told a new reason by a refresh (Placement's Explain, every KUMIKI_BINDER_REASON_REFRESH_S)",
)
SENT_BACK = Counter(
    "kumiki_binder_gangs_sent_back_total",
    "Gangs refused at their bind and placed again: a node gone, cordoned or no longer admitting the pod (node), or"
    " a pod placed meanwhile barring it by pod affinity or anti-affinity (pod_affinity)",
    ["why"],
)
AFFINITY_REFRESHED = Counter(
    "kumiki_binder_affinity_lists_refreshed_total",
    "Gangs queued in Placement submitted again with new node lists: pods they keep to or away from moved",
)
REPLACEMENTS = Counter(
    "kumiki_binder_replacements_total",
    "Pods that joined a placed gang and took the place (node and GPUs) of a member that was deleted",
)
