"""What the simulator takes and gives back, and what it keeps of each job while it runs: the job specs (with the
true durations, which never leave the simulator), each job's result, the time series, and the run's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import GangRequest
from kumiki.sim.gate import GateLook


@dataclass(frozen=True, slots=True)
class SimJobSpec:
    """One job to simulate; `duration_s` is the truth and stays inside the simulator."""

    job_id: str
    submit_s: float
    gpus: int
    duration_s: float
    queue: str = ""
    user: str = ""
    name: str = ""
    image: str = ""
    command: str = ""
    time_limit_s: float | None = None
    # a zombie: holds its GPUs for its whole run and computes nothing (`kumiki.sim.scenarios.is_idle_job`)
    idle: bool = False


@dataclass(slots=True)
class JobResult:
    job_id: str
    gpus: int
    queue: str
    submit_s: float
    first_start_s: float
    finish_s: float
    run_wall_s: float
    preemptions: int
    lost_gpu_s: float
    checkpoint_gpu_s: float
    # the job's own run time (its work, no waiting or overhead): the same in every run, so jobs can be
    # grouped by it when two policies are compared
    duration_s: float
    idle: bool = False  # a zombie (`SimJobSpec.idle`)

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.submit_s

    @property
    def queue_s(self) -> float:
        return self.jct_s - self.run_wall_s


@dataclass(slots=True)
class Sample:
    time_s: float
    allocated_gpus: int
    queue_length: int
    fragmented_gpus: int


@dataclass(slots=True)
class SimResult:
    policy: str
    total_gpus: int
    jobs: list[JobResult]
    samples: list[Sample]
    events: int
    busy_gpu_s: float = 0.0
    # the forecast gate's looks, for policies that gate their forecasts (`kumiki.sim.gate`)
    gate_looks: list[GateLook] = field(default_factory=list)
    # with a queue tree (`SimConfig.quota`): denials by code, reclaim victims, GPU-seconds metered per queue
    quota: dict[str, Any] | None = None
    idle_gpu_s: float = 0.0  # GPU-seconds held by zombies (in busy_gpu_s too: allocated, computing nothing)
    idle_found: int = 0  # zombie attempts that ran long enough for telemetry to find them
    idle_reclaimed: int = 0  # of those, attempts idle reclaim evicted


@dataclass(slots=True)
class SimJob:
    """A job's state inside the simulator: its truth (`duration_s`), its progress, and its current attempt."""

    spec: SimJobSpec
    features: JobFeatures
    duration_s: float
    request: GangRequest
    progress_s: float = 0.0
    run_start_s: float = -1.0
    run_start_progress_s: float = 0.0
    overhead_s: float = 0.0
    first_start_s: float = -1.0
    run_wall_s: float = 0.0
    attained_gpu_s: float = 0.0
    preemptions: int = 0
    idle_reclaims: int = 0
    lost_gpu_s: float = 0.0
    checkpoint_gpu_s: float = 0.0
    generation: int = 0
    # when the attempt began to wait (its arrival, or its previous attempt's eviction): the starvation clock, held
    # by quota or queued (placement's `PendingJob.waiting_since_s`); set at arrival
    waiting_since_s: float = 0.0
    forecast: RuntimeForecast | None = None
    finish_s: float = -1.0
    running: bool = False
    checkpointing: bool = False
    checkpoint_until_s: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
