"""What a Bind asks and what the book answers, in core terms: the command, a bound or pending job, the outcome
of a bind and an Explain answer, and the job as the queue policy sees it (`job_view`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kumiki.sched.cluster import Placement
from kumiki.sched.forecasting import JobFeatures, RuntimeForecast
from kumiki.sched.jobs import GangRequest, JobView
from kumiki.sched.placement import PendingReason


class BindConflict(ValueError):
    """A bind that contradicts the book (an older generation, or a new one while the old still holds GPUs)."""


@dataclass(frozen=True, slots=True)
class BindCommand:
    """One Bind request in core terms. `generation` makes binds idempotent and orders attempts."""

    job_id: str
    generation: int
    queue: str
    request: GangRequest
    priority_tier: int = 0
    preemptible: bool = False
    user: str = ""
    name: str = ""
    # what the pods carry for the forecaster: the image, the first container's command line, the run time asked for
    image: str = ""
    command_line: str = ""
    time_limit_s: float | None = None


@dataclass(frozen=True, slots=True)
class BoundJob:
    command: BindCommand
    placement: Placement
    node_names: tuple[str, ...]  # per pod of `placement.pods`: names survive node re-indexing
    bound_s: float = 0.0  # when it was bound (a restart keeps it: run times count from the bind)
    waited_s: float = 0.0  # how long it waited in the queue before this bind (0: placed on arrival)

    @property
    def arrived_s(self) -> float:
        """When the job arrived (its first generation's submission): its place in FIFO orders."""
        return self.bound_s - self.waited_s


@dataclass(frozen=True, slots=True)
class PendingJob:
    command: BindCommand
    reason: PendingReason
    submitted_s: float  # when it first arrived: the queue order of FIFO policies
    held: bool = False  # held back by quota admission: not in the scheduler's queue
    # when this attempt began to wait (its arrival, or its previous attempt's eviction): the starvation clock,
    # held or queued; None: since it arrived
    queued_s: float | None = None

    @property
    def waiting_since_s(self) -> float:
        return self.submitted_s if self.queued_s is None else self.queued_s


@dataclass(frozen=True, slots=True)
class BindOutcome:
    """Bound (`job` set, `replayed` when this answers a repeated request) or pending (`reason` set).

    `started`: other waiting jobs the same scheduling pass started; the caller publishes them too."""

    job: BoundJob | None = None
    reason: PendingReason | None = None
    replayed: bool = False
    started: tuple[BoundJob, ...] = ()

    @property
    def bound(self) -> bool:
        return self.job is not None


@dataclass(frozen=True, slots=True)
class ServiceSoFar:
    """What a job's earlier attempts got, which the queue policy weighs a requeued generation by (the simulator's
    job carries the same): without it an evicted job ranked as new, at the top of attained service (`tiresias`) and
    with its forecast's prior belief (`kumiki`), and a long job came back ahead of the short ones it yielded to."""

    executed_s: float = 0.0  # work kept: run time less what was lost since the last checkpoint
    attained_gpu_s: float = 0.0  # GPU-seconds held, lost work included (Tiresias' attained service)
    preemptions: int = 0
    idle_reclaims: int = 0  # of those, evictions by idle reclaim (every one, for Explain)
    reclaimed_generation: int = 0  # the newest attempt idle reclaim evicted
    computing_generation: int = 0  # the newest attempt telemetry found computing (kumiki.gpu.busy): see `demoted`

    @property
    def demoted(self) -> bool:
        """Idle reclaim evicted an attempt and no later one has been found computing: it waits behind the jobs of
        its tier idle reclaim has not evicted. A generation, not a time, so the order busy reports and evictions
        are read in (two topics, and a restart reads both again) does not matter."""
        return self.idle_reclaims > 0 and self.computing_generation <= self.reclaimed_generation

    def after_eviction(
        self, runtime_s: float, gpus: float, lost_gpu_s: float, idle_reclaim: bool = False, generation: int = 0
    ) -> ServiceSoFar:
        """This plus one evicted attempt (`generation`) that ran `runtime_s` on `gpus` and lost `lost_gpu_s` of it
        (evicted by idle reclaim: `idle_reclaim`)."""
        runtime_s = max(0.0, runtime_s)
        lost_s = min(runtime_s, max(0.0, lost_gpu_s) / gpus) if gpus > 0 else 0.0
        return ServiceSoFar(
            self.executed_s + runtime_s - lost_s,
            self.attained_gpu_s + runtime_s * gpus,
            self.preemptions + 1,
            self.idle_reclaims + idle_reclaim,
            max(self.reclaimed_generation, generation) if idle_reclaim else self.reclaimed_generation,
            self.computing_generation,
        )

    def computing(self, generation: int) -> ServiceSoFar:
        """Telemetry found attempt `generation` computing."""
        return replace(self, computing_generation=max(self.computing_generation, generation))


@dataclass(frozen=True, slots=True)
class Explanation:
    status: str  # "bound", "pending" or "unknown"
    queue: str = ""
    reasons: tuple[PendingReason, ...] = ()
    queue_position: int = 0
    job: BoundJob | None = None
    waiting_since_s: float | None = None  # pending: when this attempt began to wait (the starvation clock)
    starves_at_s: float | None = None  # pending, under a policy with a starvation guard: when it acts
    service: ServiceSoFar = ServiceSoFar()  # what its evicted attempts ran


def queued_reason(command: BindCommand) -> PendingReason:
    return PendingReason(command.job_id, "order", "queued", command.request.pods[0].shape())


def quota_reason(command: BindCommand, denied: str) -> PendingReason:
    """A job quota has not admitted: held out of the queue with quota's own words."""
    return PendingReason(command.job_id, "quota", denied, command.request.pods[0].shape())


def job_view(
    command: BindCommand,
    submitted_s: float,
    forecast: RuntimeForecast | None = None,
    service: ServiceSoFar | None = None,
) -> JobView:
    """What the queue policy sees of a live job: its submit-time features, its forecast and what its earlier
    attempts ran (this attempt's own run the scheduler counts from its start)."""
    gpus = command.request.gpu_demand
    service = service or ServiceSoFar()
    features = JobFeatures(
        command.job_id,
        command.queue,
        command.user,
        gpus,
        command.name,
        submitted_s,
        command.image,
        command.command_line,
        command.time_limit_s,
    )
    return JobView(
        features,
        gpus=round(gpus),
        queue=command.queue,
        submit_s=submitted_s,
        priority=command.priority_tier,
        preemptible=command.preemptible,
        forecast=forecast,
        executed_s=service.executed_s,
        attained_gpu_s=service.attained_gpu_s,
        preemptions=service.preemptions,
        idle_reclaims=service.idle_reclaims if service.demoted else 0,  # only those that still count against it
    )
