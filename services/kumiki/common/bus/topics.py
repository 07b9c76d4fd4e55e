"""The registry of Kumiki's topics: name, key, payload type, partitions, cleanup policy, retention.

Payload validators live here too, beside the topic, so every consumer of a topic rejects the same bad
records (to the dead-letter topic) with the same reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from kumiki.common.contracts.v1 import checkpoints_pb2, events_pb2

DAY_MS = 24 * 3600 * 1000

Validator = Callable[[Message], list[str]]


@dataclass(frozen=True)
class TopicSpec:
    """One topic. `name` is unprefixed; KafkaSettings.topic_prefix is prepended on the wire."""

    name: str
    payload: type[Message] | None
    key: str
    cleanup_policy: str = "delete"
    retention_ms: int = 7 * DAY_MS
    partitions: int | None = None  # None: KafkaSettings.default_partitions
    validate: Validator = field(default=lambda message: [], compare=False)

    def full_name(self, prefix: str) -> str:
        return f"{prefix}{self.name}"

    @property
    def ce_type(self) -> str:
        return f"dev.kumiki.v1.{self.payload.DESCRIPTOR.name}" if self.payload else "dev.kumiki.v1.Raw"

    def configs(self) -> dict[str, str]:
        configs = {"cleanup.policy": self.cleanup_policy}
        if self.cleanup_policy == "delete":
            configs["retention.ms"] = str(self.retention_ms)
        return configs


def _required(message: Message, *names: str) -> list[str]:
    return [f"{name}: required" for name in names if not getattr(message, name)]


def _job_required(message: Message) -> list[str]:
    job = message.job  # type: ignore[attr-defined]
    problems = [] if job.job_id else ["job.job_id: required"]
    if job.job_id and job.generation == 0:
        problems.append("job.generation: must be >= 1")
    return problems


def validate_gpu_sample(message: Message) -> list[str]:
    sample = message
    assert isinstance(sample, events_pb2.GpuSample)
    problems = _required(sample, "node", "gpu_uuid")
    for name in ("gpu_utilization_pct", "memory_utilization_pct"):
        if sample.HasField(name) and not 0.0 <= getattr(sample, name) <= 100.0:
            problems.append(f"{name}: must be within 0..100, got {getattr(sample, name):g}")
    has_memory = sample.HasField("memory_used_mib") and sample.HasField("memory_total_mib")
    if has_memory and sample.memory_used_mib > sample.memory_total_mib:
        problems.append(f"memory_used_mib: {sample.memory_used_mib} exceeds memory_total_mib {sample.memory_total_mib}")
    if sample.HasField("power_w") and sample.power_w < 0:
        problems.append(f"power_w: must be >= 0, got {sample.power_w:g}")
    return problems


def validate_node_state(message: Message) -> list[str]:
    assert isinstance(message, events_pb2.NodeState)
    problems = _required(message, "node")
    indices = [gpu.index for gpu in message.gpus]
    if len(set(indices)) != len(indices):
        problems.append("gpus.index: repeated GPU index")
    return problems


def validate_job_lifecycle(message: Message) -> list[str]:
    assert isinstance(message, events_pb2.JobLifecycle)
    problems = _job_required(message)
    if message.state == events_pb2.JOB_STATE_UNSPECIFIED:
        problems.append("state: required")
    if message.gpus < 0:
        problems.append(f"gpus: must be >= 0, got {message.gpus:g}")
    return problems


def validate_forecast(message: Message) -> list[str]:
    assert isinstance(message, events_pb2.RuntimeForecast)
    problems = _job_required(message)
    if message.p50_s < 0 or message.p90_s < message.p50_s:
        problems.append(f"p90_s: need 0 <= p50_s <= p90_s, got {message.p50_s:g} and {message.p90_s:g}")
    return problems


def validate_quota_state(message: Message) -> list[str]:
    return _required(message, "queue")


def validate_decision(message: Message) -> list[str]:
    assert isinstance(message, events_pb2.SchedulingDecision)
    problems = _required(message, "decision_id") + _job_required(message)
    if message.kind == events_pb2.DECISION_KIND_UNSPECIFIED:
        problems.append("kind: required")
    return problems


def validate_preemption(message: Message) -> list[str]:
    assert isinstance(message, events_pb2.PreemptionCommand)
    problems = _required(message, "command_id") + _job_required(message)
    if message.action == events_pb2.PREEMPTION_ACTION_UNSPECIFIED:
        problems.append("action: required")
    return problems


GPU_SAMPLES = TopicSpec(
    "gpu.samples", events_pb2.GpuSample, "node/gpu_uuid", retention_ms=DAY_MS, validate=validate_gpu_sample
)
CLUSTER_STATE = TopicSpec(
    "cluster.state", events_pb2.NodeState, "node", cleanup_policy="compact", validate=validate_node_state
)
# The agents' static view of their node (GPUs, memory, MIG layout, NVLink islands): telemetry merges it with
# live samples and allocations into the NodeState it publishes on cluster.state, and a node is known to
# telemetry once it has a record here (or on cluster.state).
NODE_INVENTORY = TopicSpec(
    "node.inventory", events_pb2.NodeState, "node", cleanup_policy="compact", validate=validate_node_state
)
GPU_IDLE = TopicSpec("gpu.idle", events_pb2.GpuIdle, "job_id", retention_ms=7 * DAY_MS, validate=_job_required)
# The complement of gpu.idle: a job's GPUs computing, once per attempt and node and again after each idle episode
# (placement lifts an idle-reclaimed job's demotion and drops an idle finding the job has left behind).
GPU_BUSY = TopicSpec("gpu.busy", events_pb2.GpuBusy, "job_id", retention_ms=7 * DAY_MS, validate=_job_required)
JOB_LIFECYCLE = TopicSpec(
    "job.lifecycle", events_pb2.JobLifecycle, "job_id", retention_ms=30 * DAY_MS, validate=validate_job_lifecycle
)
JOB_FORECAST = TopicSpec(
    "job.forecast", events_pb2.RuntimeForecast, "job_id", cleanup_policy="compact", validate=validate_forecast
)
QUOTA_STATE = TopicSpec(
    "quota.state", events_pb2.QuotaState, "queue", cleanup_policy="compact", validate=validate_quota_state
)
SCHEDULING_DECISIONS = TopicSpec(
    "scheduling.decisions",
    events_pb2.SchedulingDecision,
    "job_id",
    retention_ms=30 * DAY_MS,
    validate=validate_decision,
)
PREEMPTION_COMMANDS = TopicSpec(
    "preemption.commands", events_pb2.PreemptionCommand, "job_id", retention_ms=7 * DAY_MS, validate=validate_preemption
)
# Every acknowledged checkpoint (the preemption service publishes what Checkpoints.Report recorded), key = job
# id: placement chooses victims by the work since each job's newest one; the forecast service forecasts a running
# job again from a report that says how far it has got (step of total_steps).
CHECKPOINTS = TopicSpec(
    "checkpoints", checkpoints_pb2.CheckpointReport, "job_id", retention_ms=30 * DAY_MS, validate=_job_required
)
DEAD_LETTER = TopicSpec("dead-letter", None, "original key", retention_ms=14 * DAY_MS, partitions=1)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    GPU_SAMPLES,
    CLUSTER_STATE,
    NODE_INVENTORY,
    GPU_IDLE,
    GPU_BUSY,
    JOB_LIFECYCLE,
    JOB_FORECAST,
    QUOTA_STATE,
    SCHEDULING_DECISIONS,
    PREEMPTION_COMMANDS,
    CHECKPOINTS,
    DEAD_LETTER,
)
