"""Prometheus metrics of telemetry ingest (served on the shell's /metrics)."""

from prometheus_client import Counter, Gauge, Histogram

from kumiki.common.metrics import labelled
from kumiki.telemetry import core

GPU_UTILISATION = Gauge("kumiki_gpu_utilization_percent", "Latest SM utilisation per GPU", ["node", "gpu"])
NODE_UTILISATION = Gauge(
    "kumiki_node_gpu_utilization_percent", "Mean SM utilisation of a node's GPUs in the current window", ["node"]
)
QUEUE_UTILISATION = Gauge(
    "kumiki_queue_gpu_utilization_percent", "Mean SM utilisation of a queue's allocated GPUs (usage window)", ["queue"]
)
NODE_ALLOCATED = Gauge("kumiki_node_allocated_gpus", "GPUs held by jobs on a node", ["node"])
NODE_USED = Gauge("kumiki_node_used_gpus", "GPU-equivalents those jobs use (sum of utilisation / 100)", ["node"])
NODE_FREE = Gauge("kumiki_node_free_gpus", "Healthy GPUs held by no job", ["node"])
NODE_HEALTHY = Gauge("kumiki_node_healthy", "1 while the node reports and has no fatal error", ["node"])
QUEUE_GAP = Gauge(
    "kumiki_queue_allocated_unused_gpus",
    "Allocated minus used GPUs of a queue, averaged over the usage window",
    ["queue"],
)
IDLE_GPU_HOURS = Counter(
    "kumiki_queue_idle_gpu_hours", "GPU-hours allocated to a queue's jobs while below its idle threshold", ["queue"]
)
IDLE_EVENTS = Counter("kumiki_gpu_idle_events_total", "gpu.idle events published", ["queue"])
BUSY_EVENTS = Counter("kumiki_gpu_busy_events_total", "gpu.busy events published", ["queue"])
SAMPLES = Counter("kumiki_telemetry_samples_total", "Valid samples aggregated")
SAMPLE_LAG = Gauge("kumiki_telemetry_sample_lag_seconds", "Age of the newest sample in the last batch at ingest")
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 300)
SAMPLE_LAG_SECONDS = Histogram(
    "kumiki_telemetry_sample_age_seconds",
    "Age of the oldest sample of each consumed batch at ingest (ingest time minus sampled_at)",
    buckets=LAG_BUCKETS,
)
STATE_LAG_SECONDS = Histogram(
    "kumiki_telemetry_state_age_seconds",
    "Age of the newest sample of each chunk when it is folded into node state (end-to-end lag)",
    buckets=LAG_BUCKETS,
)
COMMIT_WAIT = Gauge(
    "kumiki_telemetry_commit_wait_seconds",
    "How long records have waited behind a committed offset of the faust group that does not move (0: caught up"
    " or moving); at KUMIKI_TELEMETRY_COMMIT_STALL_S the service exits to read them again",
)


def node_gauges(view: core.NodeView) -> None:
    """Set whenever the node's view is built: at every placement-relevant change and at least every
    publish interval (per-GPU utilisation is as fresh as cluster.state)."""
    allocated, used = core.allocated_vs_used(view)
    labelled(NODE_ALLOCATED, view.node).set(allocated)
    labelled(NODE_USED, view.node).set(used)
    labelled(NODE_FREE, view.node).set(len(view.free_gpus))
    labelled(NODE_HEALTHY, view.node).set(1 if view.healthy else 0)
    for gpu in view.gpus:
        labelled(GPU_UTILISATION, view.node, gpu.uuid).set(gpu.utilization_pct)
