"""The allocation book of the live cluster (`PlacementBook`): nodes, binds, pending and held jobs, preempted jobs
draining, idle reclaim and Explain, over the scheduling core's `Scheduler`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from kumiki.placement.core.commands import (
    BindCommand,
    BindConflict,
    BindOutcome,
    BoundJob,
    Explanation,
    PendingJob,
    ServiceSoFar,
    job_view,
    queued_reason,
    quota_reason,
)
from kumiki.sched.cluster import AllocationError, ClusterSpec, ClusterState, NodeSpec, Placement, PodPlacement
from kumiki.sched.forecasting import RuntimeForecast
from kumiki.sched.idle import IDLE_RECLAIM, IdleJob, IdlePolicy, WaitingFor, idle_victims, waiting_for_gpus
from kumiki.sched.jobs import JobView
from kumiki.sched.placement import PendingReason, place_gang
from kumiki.sched.policies import POLICIES, admission_rank
from kumiki.sched.scheduler import MIN_RUN_BEFORE_PREEMPT_S, Preemption, Scheduler

# Queue policies the live service can run. The preemptive ones (`kumiki`, `tiresias`) name victims; the
# preemption coordinator checkpoints and evicts them, and releases them here as PREEMPTED (docs/preemption.md).
# `kumiki` reads each job's forecast (job.forecast) when it is queued.
# `kumiki-defrag` also moves small jobs off the nodes a gang blocked only by fragmentation needs, when the value
# test says the gang's wait saved outweighs their lost work (kumiki.sched.preemption.move_value).
LIVE_POLICIES = ("fifo", "fifo-backfill", "kumiki", "kumiki-defrag", "tiresias")
ENDED_KEPT = 200_000  # ended generations remembered (a few dozen bytes each)
# admission rounds a victim gives way to the quota-held job its GPUs were freed for (a bound on how stale quota's
# view of the release may be, not a tuned number: 5 s at the local stack's 0.1 s cycle)
YIELD_ROUNDS = 50
# a job no attempt of which was evicted or found computing yet (frozen: one instance serves every such job)
NOT_SERVED = ServiceSoFar()


@dataclass(frozen=True, slots=True)
class Victim:
    """A job the scheduling pass preempted: its GPUs are the beneficiary's in the book, but it still runs until
    the coordinator has it checkpoint and evicts it, and releases it here (`release_preempted`)."""

    job: BoundJob
    preemption: Preemption
    decided_s: float = 0.0  # when the pass decided it (its unsaved work is measured at this moment)


@dataclass
class PlacementBook:
    """Nodes, allocations and pending jobs. Mutated only through its methods, on one thread."""

    strategy: str = "kumiki"
    policy: str = "fifo-backfill"
    nodes: list[NodeSpec] = field(default_factory=list)
    healthy: list[bool] = field(default_factory=list)
    index_of: dict[str, int] = field(default_factory=dict)
    bound: dict[str, BoundJob] = field(default_factory=dict)
    pending: dict[str, PendingJob] = field(default_factory=dict)
    orphans: dict[str, BoundJob] = field(default_factory=dict)  # bound on nodes not (yet) known
    min_run_s: float = MIN_RUN_BEFORE_PREEMPT_S  # a job is not preempted again within this long of its bind
    # preempted jobs still running until evicted; jobs bound onto their GPUs wait (nominated) until they leave
    draining: dict[str, Victim] = field(default_factory=dict)
    nominated: dict[str, BoundJob] = field(default_factory=dict)
    preemptions: list[Victim] = field(default_factory=list)  # decided, not yet published (the adapter drains it)
    acknowledged: dict[str, float] = field(default_factory=dict)  # job -> newest acknowledged checkpoint (unix s)
    forecasts: dict[str, RuntimeForecast] = field(default_factory=dict)  # job -> run-time forecast
    # job -> what its evicted attempts ran and its latest attempt found computing (the policy's view of its next
    # generations), until it ends
    served: dict[str, ServiceSoFar] = field(default_factory=dict)
    favoured: list[BoundJob] = field(default_factory=list)  # beneficiaries started on release, published next cycle
    # attempts whose PREEMPTED release is being published: an ending (Release COMPLETED) meanwhile is refused, so
    # an attempt ends exactly once, evicted or completed
    releasing: set[tuple[str, int]] = field(default_factory=set)
    idle_policies: dict[str, IdlePolicy] = field(default_factory=dict)  # queue (or "*") -> idle reclaim rule
    idle: dict[str, tuple[int, float, float]] = field(default_factory=dict)  # job -> (generation, since, until)
    # victim -> (the quota-held job its GPUs were freed for, admission rounds it may still sit out): the victim is
    # not asked of quota (nor bound by a Bind retry) while that job is held, for at most YIELD_ROUNDS rounds, else
    # an older victim (FIFO), or a Bind arriving before quota has seen the release, would take its GPUs straight back
    yielding: dict[str, tuple[str, int]] = field(default_factory=dict)
    # quota-held jobs a victim's GPUs were freed for: admitted, such a job starts on them at once, ahead of the
    # queue order, as one already waiting does on the release
    freed_for: set[str] = field(default_factory=set)
    # job -> its newest generation that ran to its end (completed or failed), the oldest forgotten past
    # ENDED_KEPT: a Bind of that generation retried late (across a restart, after the job finished) is refused
    ended: dict[str, int] = field(default_factory=dict)
    _scheduler: Scheduler | None = None  # over the current ClusterState; rebuilt when the node list changes
    _stale: bool = True  # nodes were added since the scheduler was built: rebuild on next use

    def __post_init__(self) -> None:
        if self.policy not in LIVE_POLICIES:
            raise ValueError(f"policy {self.policy!r} cannot run live (live policies: {', '.join(LIVE_POLICIES)})")

    @property
    def scheduler(self) -> Scheduler:
        """The core's scheduler; adding nodes only marks it stale, so replaying 1,000 nodes is one rebuild."""
        if self._stale or self._scheduler is None:
            self._stale = False
            displaced = self._rebuild()
            assert not displaced, "adding nodes cannot displace allocations"
        assert self._scheduler is not None
        return self._scheduler

    @property
    def state(self) -> ClusterState:
        return self.scheduler.state

    # ---- nodes ---------------------------------------------------------------------------------
    def upsert_node(self, spec: NodeSpec, healthy: bool) -> list[BoundJob]:
        """Add or update a node; returns jobs whose allocation no longer fits the changed node (released)."""
        index = self.index_of.get(spec.name)
        if index is None:
            self.index_of[spec.name] = len(self.nodes)
            self.nodes.append(spec)
            self.healthy.append(healthy)
            self._stale = True
            if self.orphans:
                self._adopt_orphans()
            return []
        self.healthy[index] = healthy
        if self.nodes[index] != spec:
            self.nodes[index] = spec
            return self._rebuild()
        self._recordon()
        return []

    def remove_node(self, name: str) -> None:
        """A node that left: it keeps its index (allocations name it) but never receives work again."""
        index = self.index_of.get(name)
        if index is not None:
            self.healthy[index] = False
            self._recordon()

    def _recordon(self) -> None:
        """A health change reaches the live state (a stale one gets it when rebuilt)."""
        if self._scheduler is not None and not self._stale:
            self._scheduler.state.cordoned = self._cordoned()

    def _cordoned(self) -> frozenset[int]:
        return frozenset(index for index, healthy in enumerate(self.healthy) if not healthy)

    def _rebuild(self) -> list[BoundJob]:
        """A fresh state and scheduler over the current nodes: bound jobs re-applied, waiting jobs re-queued."""
        state = ClusterState.empty(ClusterSpec(tuple(self.nodes)))
        state.cordoned = self._cordoned()
        scheduler = Scheduler(
            POLICIES[self.policy], state, self.strategy, min_run_s=self.min_run_s, acknowledged=self.acknowledged
        )
        displaced = []
        for job_id, job in list(self.bound.items()):
            try:
                view = self._view(job.command, job.bound_s)
                scheduler.adopt(view, job.command.request, job.placement, job.bound_s)
            except AllocationError:
                del self.bound[job_id]
                displaced.append(job)
        for pending in sorted(self.pending.values(), key=lambda item: item.submitted_s):
            if not pending.held:
                self._enqueue(scheduler, pending)
        self._scheduler = scheduler
        return displaced

    def _view(self, command: BindCommand, submitted_s: float) -> JobView:
        return job_view(command, submitted_s, self.forecasts.get(command.job_id), self.served.get(command.job_id))

    def _enqueue(self, scheduler: Scheduler, pending: PendingJob) -> None:
        """Into the scheduler's queue in its arrival order, its starvation counted since it began to wait: from
        its arrival, a job evicted a day after it arrived would starve at once and evict in turn."""
        view = self._view(pending.command, pending.submitted_s)
        scheduler.submit(view, pending.command.request, now=pending.waiting_since_s)

    def _adopt_orphans(self) -> None:
        for job_id, job in list(self.orphans.items()):
            if all(name in self.index_of for name in job.node_names):
                del self.orphans[job_id]
                self.restore(
                    job.command,
                    [(name, pod) for name, pod in zip(job.node_names, job.placement.pods, strict=True)],
                    job.bound_s,
                )

    # ---- binds ---------------------------------------------------------------------------------
    def bind(self, command: BindCommand, now: float) -> BindOutcome:
        """Queue a gang and run a scheduling pass: bound whole, or pending with the reason; a repeated
        (job, generation) gets the same answer."""
        finished = self.ended.get(command.job_id, 0)
        if command.generation <= finished:
            raise BindConflict(
                f"job.generation: generation {finished} of this job already ran to its end; bind generation"
                f" {finished + 1} to run it again"
            )
        current = self.bound.get(command.job_id)
        if (
            current is not None
            and command.job_id in self.nominated
            and current.command.generation == command.generation
        ):
            return BindOutcome(reason=self._nominated_reason(command))
        if current is None and command.job_id in self.draining:
            current = self.draining[command.job_id].job
        if current is not None:
            if current.command.generation == command.generation:
                return BindOutcome(job=current, replayed=True)
            if current.command.generation > command.generation:
                raise BindConflict(
                    f"job.generation: {command.generation} is older than the bound generation "
                    f"{current.command.generation}"
                )
            raise BindConflict(
                f"job.generation: generation {current.command.generation} still holds an allocation; release it first"
            )
        if not self.nodes:
            reason = PendingReason(command.job_id, "nodes", "the cluster has no nodes yet", "any node")
            self._queue(command, reason, now)
            return BindOutcome(reason=reason)
        scheduler = self.scheduler
        if not scheduler.waiting and scheduler.reservation is None and command.job_id not in self.pending:
            # An empty queue: the pass would try this job alone, with nothing reserved; do that without queueing.
            found = place_gang(scheduler.state, command.request, self.strategy, explain=False)
            if isinstance(found, Placement) and not self._on_draining(found):
                scheduler.adopt(self._view(command, now), command.request, found, now)
                return BindOutcome(job=self._bound(command, found, now))
        self._queue(command, queued_reason(command), now)
        started = self.cycle(now)
        job = self.bound.get(command.job_id)
        if job is not None and command.job_id not in self.nominated:
            return BindOutcome(job=job, started=tuple(other for other in started if other is not job))
        if job is not None:
            return BindOutcome(reason=self._nominated_reason(command), started=tuple(started))
        reason = self._why_waiting(command.job_id)
        self.pending[command.job_id] = replace(self.pending[command.job_id], reason=reason)
        return BindOutcome(reason=reason, started=tuple(started))

    def _queue(self, command: BindCommand, reason: PendingReason, now: float, submitted_s: float | None = None) -> None:
        """Put a job in the scheduler's queue (a retry of a waiting job keeps its place and its wait). `now`: when
        it begins to wait; `submitted_s`: its arrival, for an attempt of a job that arrived before (default now)."""
        previous = self.pending.get(command.job_id)
        if previous is not None and not previous.held and previous.command == command:
            return
        scheduler = self.scheduler if self.nodes else None  # rebuilt first, so the job is queued once
        if previous is not None:
            self.withdraw(command.job_id)
            pending = PendingJob(command, reason, previous.submitted_s, queued_s=previous.waiting_since_s)
        else:
            pending = PendingJob(command, reason, now if submitted_s is None else submitted_s, queued_s=now)
        self.pending[command.job_id] = pending
        if scheduler is not None:
            self._enqueue(scheduler, pending)

    def cycle(self, now: float) -> list[BoundJob]:
        """A scheduling pass of the core's policy; returns the jobs it started (the caller publishes them).

        Preemptive policies may name victims (`preemptions`, for the adapter to publish): they keep running
        until evicted, and a job the pass placed on their GPUs is nominated, not started, until they leave."""
        if not self.nodes:
            return []
        started = self._ready_nominated() + self.favoured
        self.favoured = []
        scheduler = self.scheduler
        self._reclaim_idle(now)
        decisions = scheduler.schedule(now, consider_preemption=scheduler.policy.preemptive)
        for preemption in decisions.preemptions:
            victim = self.bound.pop(preemption.job_id, None)
            if victim is None:  # a job the same pass started and preempted at once: nothing ran yet
                continue
            entry = Victim(victim, preemption, now)
            self.draining[preemption.job_id] = entry
            self.preemptions.append(entry)
        for start in decisions.starts:
            waiting = self.pending.pop(start.job_id)
            self._start_or_nominate(
                self._bound(waiting.command, start.placement, now, now - waiting.submitted_s), started
            )
        return started

    def _start_or_nominate(self, job: BoundJob, started: list[BoundJob]) -> None:
        """A job just placed starts (into `started`), or waits nominated when its GPUs hold a preempted job that has
        not left yet. Every way of placing a job goes through here: the pass, a victim moved elsewhere, a
        beneficiary started ahead of the queue (the scheduler's state counts a victim's GPUs free once named)."""
        if self._on_draining(job.placement):
            self.nominated[job.command.job_id] = job
        else:
            started.append(job)

    def _gpus_of(self, placement: Placement) -> set[tuple[int, int]]:
        return {(pod.node, gpu) for pod in placement.pods for gpu in self._pod_gpus(pod)}

    @staticmethod
    def _pod_gpus(pod: PodPlacement) -> tuple[int, ...]:
        if pod.gpus:
            return pod.gpus
        if pod.share is not None:
            return (pod.share.gpu,)
        if pod.mig is not None:
            return (pod.mig.gpu,)
        return ()

    def _on_draining(self, placement: Placement) -> bool:
        """Whether a placement uses a GPU that a preempted job has not left yet."""
        if not self.draining:
            return False
        held = self._gpus_of(placement)
        return any(held & self._gpus_of(victim.job.placement) for victim in self.draining.values())

    def _ready_nominated(self) -> list[BoundJob]:
        """Nominated jobs whose GPUs every preempted job has now left: they start (the caller publishes them)."""
        ready = [job for job in self.nominated.values() if not self._on_draining(job.placement)]
        for job in ready:
            del self.nominated[job.command.job_id]
        return ready

    def _nominated_reason(self, command: BindCommand) -> PendingReason:
        return PendingReason(
            command.job_id,
            "preemption",
            "placed; waits for the preempted jobs on its GPUs to checkpoint and leave",
            command.request.pods[0].shape(),
        )

    def preempted_attempt(self, job_id: str, generation: int) -> BoundJob | None:
        """The attempt a PREEMPTED release would free (draining, or bound after a restart); None: nothing held."""
        victim = self.draining.get(job_id)
        if victim is not None and (not generation or victim.job.command.generation == generation):
            return victim.job
        job = self.bound.get(job_id)
        if job is None or job_id in self.nominated or (generation and job.command.generation != generation):
            return None
        return job

    def release_preempted(
        self,
        job_id: str,
        generation: int,
        now: float,
        beneficiary: str = "",
        denied: str | None = None,
        lost_gpu_s: float | None = None,
        cause: str = "",
    ) -> tuple[BoundJob, BindCommand] | None:
        """The coordinator evicted this attempt: free it and queue the job again as the next generation (keeping
        its arrival time). None when that attempt holds nothing (released already: idempotent).

        Quota released the attempt's admission with it, so the next generation is admitted afresh like an
        arrival: `denied` is quota's reason when it was not, and the job is then held (asked again each cycle)
        rather than queued, even one moved off a gang's node. The attempt's run, less `lost_gpu_s` (what the
        coordinator says was lost since the last checkpoint; default the book's own estimate), counts towards the
        job's service so far (`served`), which the policy ranks its next generations by. `cause`: why it was
        chosen, for a victim this book has no decision for (a restart found it still bound)."""
        cause = self.eviction_cause(job_id, cause)
        victim = self.draining.get(job_id)
        moved = False
        if victim is not None and (not generation or victim.job.command.generation == generation):
            del self.draining[job_id]
            job = victim.job
            moved = victim.preemption.reason == "defragmentation"
        else:
            found = self.release(job_id, generation)  # after a restart a victim is simply bound
            if found is None:
                return None
            job = found
        self.preemptions = [entry for entry in self.preemptions if entry.job is not job]
        decided = victim.preemption if victim is not None and victim.job is job else None
        if lost_gpu_s is None:
            lost_gpu_s = decided.lost_gpu_s if decided is not None else 0.0
        self.served[job_id] = self.served_so_far(job_id).after_eviction(
            now - job.bound_s, job.command.request.gpu_demand, lost_gpu_s, cause == IDLE_RECLAIM, job.command.generation
        )
        again = replace(job.command, generation=job.command.generation + 1)
        if self.freed_for_held(beneficiary):  # freed for a job quota holds back: wait behind it, held too
            reason = PendingReason(job_id, "preemption", "yielding", "", f"its GPUs went to {beneficiary}")
            self.pending[job_id] = PendingJob(again, reason, job.arrived_s, held=True, queued_s=now)
            self.yielding[job_id] = (beneficiary, YIELD_ROUNDS)
            self.freed_for.add(beneficiary)
            return job, again
        if denied is not None:
            self.pending[job_id] = PendingJob(
                again, quota_reason(again, denied), job.arrived_s, held=True, queued_s=now
            )
            self._start_freed_for(beneficiary, now)
            return job, again
        self._queue(again, queued_reason(again), now, submitted_s=job.arrived_s)  # its wait starts now
        if moved and self.nodes:  # moved off a gang's node, not stopped for its rank: it restarts elsewhere at once
            placed = self.scheduler.start_waiting(job_id, now)
            if placed is not None:
                del self.pending[job_id]
                self._start_or_nominate(self._bound(again, placed, now, 0.0), self.favoured)
        self._start_freed_for(beneficiary, now)  # the GPUs go to whom they were freed for
        return job, again

    def freed_for_held(self, beneficiary: str) -> bool:
        """Whether a victim's GPUs were freed for a job quota still holds back. The victim then waits behind it,
        held, and is not asked for at its release: admitted first, it would take back the quota it was evicted to
        give (the beneficiary holds none yet)."""
        waiting = self.pending.get(beneficiary)
        return waiting is not None and waiting.held

    def _start_freed_for(self, beneficiary: str, now: float) -> None:
        """Start the waiting job a victim's GPUs were freed for, ahead of the queue order, if it fits now."""
        waiting = self.pending.get(beneficiary)
        if waiting is not None and not waiting.held and self.nodes:
            placed = self.scheduler.start_waiting(beneficiary, now)
            if placed is not None:
                del self.pending[beneficiary]
                self._start_or_nominate(
                    self._bound(waiting.command, placed, now, now - waiting.submitted_s), self.favoured
                )

    def yields(self, job_id: str) -> bool:
        """Whether a victim still gives way to the quota-held job its GPUs were freed for (not asked, not bound)."""
        if job_id not in self.yielding:
            return False
        beneficiary, rounds_left = self.yielding[job_id]
        waiting = self.pending.get(beneficiary)
        if waiting is None or not waiting.held or job_id not in self.pending or rounds_left <= 0:
            del self.yielding[job_id]
            return False
        return True

    def gpu_idle(self, job_id: str, generation: int, since_s: float, until_s: float) -> None:
        """Telemetry reports a job's GPUs idle from `since_s` to `until_s`; consecutive windows join up."""
        known = self.idle.get(job_id)
        if known is not None and known[0] == generation and since_s <= known[2] + 1.0:
            since_s = min(since_s, known[1])
        if known is None or generation >= known[0]:
            self.idle[job_id] = (generation, since_s, max(until_s, known[2] if known and known[0] == generation else 0))

    def gpu_busy(self, job_id: str, generation: int, until_s: float) -> None:
        """Telemetry reports a job's GPUs computing up to `until_s`: an idle report it outlived no longer makes it a
        zombie to reclaim, and a job idle reclaim evicted no longer waits behind its tier once a later attempt
        computes (its owner came back)."""
        known = self.idle.get(job_id)
        if known is not None and (known[0] < generation or (known[0] == generation and known[2] <= until_s)):
            del self.idle[job_id]
        if self._gone(job_id):  # a late report of an ended job would be kept for ever
            return
        before = self.served_so_far(job_id)
        self.served[job_id] = before.computing(generation)
        if before.demoted and not self.served[job_id].demoted:
            self._reconsider(job_id)  # a next generation already waiting moves up to its arrival's place

    def _reclaim_idle(self, now: float) -> None:
        """Preempt jobs idle past their queue's threshold (`waiting`: only for a waiting job their GPUs let start),
        as `kumiki.sched.idle.idle_victims` chooses; the simulator evicts its zombies by the same choice."""
        if not self.idle or not self.idle_policies:
            return
        scheduler = self.scheduler
        idle: list[IdleJob] = []
        for job_id, (generation, since_s, until_s) in self.idle.items():
            job = self.bound.get(job_id)
            if job is None or job.command.generation != generation or job_id in self.nominated:
                continue
            if job.command.preemptible:
                idle.append((job_id, job.command.queue, until_s - since_s))

        def waiting() -> Iterable[WaitingFor]:
            # a job quota holds back waits for GPUs too: freed, the zombie's GPUs are its queue's guarantee again, and
            # idle guarantee is what quota lends; a zombie computes nothing, so trying costs only its restart
            held = (
                (job.command.job_id, job.command.request, self.served_so_far(job.command.job_id).demoted)
                for job in self.held_jobs_in_order(now)
            )
            return waiting_for_gpus(scheduler, held)

        for job_id, beneficiary in idle_victims(scheduler, idle, self.idle_policies, waiting):
            del self.idle[job_id]
            preemption = scheduler.preempt(job_id, beneficiary, IDLE_RECLAIM, now)
            victim = Victim(self.bound.pop(job_id), preemption, now)
            self.draining[job_id] = victim
            self.preemptions.append(victim)

    def eviction_cause(self, job_id: str, told: str = "") -> str:
        """Why the attempt being evicted was chosen (a preemption reason): this book's decision while it drains,
        else `told` (the coordinator's, for a victim a restart found still bound). The PREEMPTED event carries
        it, so a restart knows which evictions were idle reclaims."""
        victim = self.draining.get(job_id)
        return victim.preemption.reason if victim is not None else told

    def checkpointed(self, job_id: str, completed_s: float) -> None:
        """A job's newest acknowledged checkpoint (from kumiki.checkpoints): victim choice counts work since it.
        Not kept for a job that has ended (a report read late, or again after a restart)."""
        if self._gone(job_id):
            return
        if completed_s > self.acknowledged.get(job_id, 0.0):
            self.acknowledged[job_id] = completed_s

    def forecast(self, job_id: str, forecast: RuntimeForecast) -> None:
        """A job's run-time forecast (job.forecast: at submit, or again from the progress a running job reports).
        The scheduler sees it at once: a waiting job is re-ranked in place, a running one is weighed by it as a
        victim; a job not queued yet (held by quota, or not bound) gets it when it is. Not kept for a job that has
        ended: what the book keeps per job lasts as long as the job, not as long as the service."""
        if self._gone(job_id):
            return
        self.forecasts[job_id] = forecast
        self._reconsider(job_id)

    def _reconsider(self, job_id: str) -> None:
        """The scheduler sees the job anew (its forecast or service changed): re-ranked in place while it waits,
        weighed anew as a victim while it runs. Nothing to do before a scheduler exists: the rebuild views every job
        with what the book holds then."""
        if self._scheduler is None or self._stale:
            return
        pending, running = self.pending.get(job_id), self.bound.get(job_id) or self.nominated.get(job_id)
        if pending is not None and not pending.held:
            self._scheduler.reconsider([self._view(pending.command, pending.submitted_s)])
        elif running is not None:
            self._scheduler.reconsider([self._view(running.command, running.bound_s)])

    def _bound(self, command: BindCommand, placement: Placement, bound_s: float, waited_s: float = 0.0) -> BoundJob:
        """Record a job the scheduler now runs (node names kept: they survive node re-indexing)."""
        names = tuple(self.nodes[pod.node].name for pod in placement.pods)
        job = BoundJob(command, placement, names, bound_s, max(0.0, waited_s))
        self.bound[command.job_id] = job
        return job

    def hold(self, command: BindCommand, reason: PendingReason, now: float) -> None:
        """Keep a job out of the queue for a reason found outside the book (quota admission)."""
        previous = self.pending.get(command.job_id)
        if previous is not None and not previous.held:
            self.scheduler.withdraw(command.job_id)
        if previous is not None:
            self.pending[command.job_id] = replace(previous, command=command, reason=reason, held=True)
        else:
            self.pending[command.job_id] = PendingJob(command, reason, now, held=True, queued_s=now)

    def admit(self, job_id: str, now: float) -> None:
        """A held job that quota now admits joins the queue, keeping its arrival time; one a victim's GPUs were freed
        for starts on them at once (`freed_for`)."""
        pending = self.pending[job_id]
        if pending.held:
            scheduler = self.scheduler if self.nodes else None  # rebuilt first, so the job is queued once
            self.pending[job_id] = admitted = replace(pending, held=False)
            if scheduler is not None:
                self._enqueue(scheduler, admitted)
        if job_id in self.freed_for:
            self.freed_for.discard(job_id)
            self._start_freed_for(job_id, now)

    def restore_pending(self, command: BindCommand, submitted_s: float, queued_s: float | None = None) -> None:
        """A job that waited before a restart waits again with its arrival time (and, `queued_s`, since when this
        attempt waits; default its arrival); held until the cycle has asked admission again (quota may have
        changed while placement was down)."""
        if command.job_id in self.bound or command.job_id in self.pending:
            return
        shape = command.request.pods[0].shape()
        reason = PendingReason(command.job_id, "restart", "waits again after a restart; admission asked again", shape)
        self.pending[command.job_id] = PendingJob(command, reason, submitted_s, held=True, queued_s=queued_s)

    def held_jobs_in_order(self, now: float) -> list[PendingJob]:
        """Every job quota holds back, in the order an admission round asks for them (no round is spent): the
        policy's order, those held past its starvation limit first (`sched.policies.admission_rank`)."""
        policy = POLICIES[self.policy]

        def rank(job: PendingJob) -> tuple[tuple[float, ...], str]:
            view = self._view(job.command, job.submitted_s)
            return admission_rank(policy, view, job.waiting_since_s, now), job.command.job_id

        return sorted((job for job in self.pending.values() if job.held), key=rank)

    def held_jobs(self, now: float) -> list[PendingJob]:
        """Jobs quota held back, in admission order (the cycle asks quota again for each, once per cycle). A victim
        yielding to a held job sits out while that job is held (at most YIELD_ROUNDS rounds): quota may answer from
        before the release for a round or more, and the job the GPUs were freed for is asked first."""
        self.freed_for &= set(self.pending)  # beneficiaries gone (cancelled, bound) need nothing kept
        sitting_out = set()
        for victim in list(self.yielding):
            if self.yields(victim):
                beneficiary, rounds_left = self.yielding[victim]
                self.yielding[victim] = (beneficiary, rounds_left - 1)
                sitting_out.add(victim)
        return [job for job in self.held_jobs_in_order(now) if job.command.job_id not in sitting_out]

    def unbind(self, job_id: str, *, requeue: bool = False, now: float = 0.0) -> BoundJob:
        """Undo an allocation that could not be made durable (its event was not acknowledged).

        `requeue`: the job waits again (a cycle's start); otherwise its caller was told no."""
        job = self.bound.pop(job_id)
        self.nominated.pop(job_id, None)
        self.scheduler.finished(job_id)
        if requeue:  # the bind never took effect: the job keeps its arrival
            self._queue(job.command, queued_reason(job.command), now, submitted_s=job.arrived_s)
        return job

    def release(self, job_id: str, generation: int) -> BoundJob | None:
        """Free a job's allocation; None when it holds none for that generation (releasing twice is fine)."""
        victim = self.draining.get(job_id)
        if victim is not None and (not generation or victim.job.command.generation == generation):
            del self.draining[job_id]  # it ended on its own while asked to checkpoint: its GPUs are already given
            self.preemptions = [entry for entry in self.preemptions if entry is not victim]
            return victim.job
        job = self.bound.get(job_id)
        if job is None or (generation and job.command.generation != generation):
            return None
        del self.bound[job_id]
        self.nominated.pop(job_id, None)
        self.scheduler.finished(job_id)
        return job

    def mark_ended(self, job_id: str, generation: int) -> None:
        """The (job, generation) completed or failed: no Bind of it or of an older generation binds again."""
        previous = self.ended.pop(job_id, 0)
        self.ended[job_id] = max(previous, generation)  # re-inserted: the newest ending is forgotten last
        if self._gone(job_id):  # nothing of it runs or waits: forget its forecast, checkpoint and service so far
            self.forecasts.pop(job_id, None)
            self.acknowledged.pop(job_id, None)
            self.served.pop(job_id, None)
        while len(self.ended) > ENDED_KEPT:
            del self.ended[next(iter(self.ended))]

    def _gone(self, job_id: str) -> bool:
        """Ended (completed or failed) and neither running, evicted, waiting nor orphaned."""
        return job_id in self.ended and not any(
            job_id in table for table in (self.bound, self.draining, self.pending, self.orphans)
        )

    def withdraw(self, job_id: str) -> bool:
        """Forget a pending job (cancelled before it was bound)."""
        pending = self.pending.pop(job_id, None)
        if pending is None:
            return False
        if not pending.held and self._scheduler is not None and not self._stale:
            self._scheduler.withdraw(job_id)
        return True

    def restore(
        self, command: BindCommand, pods: Iterable[tuple[str, PodPlacement]], bound_s: float = 0.0
    ) -> BoundJob | None:
        """Re-apply a bind from the event log (node given by name); None if it is already in the book."""
        if command.job_id in self.bound:
            return None
        named = list(pods)
        names = tuple(name for name, _ in named)
        if not all(name in self.index_of for name in names):
            placement = Placement(command.job_id, tuple(pod for _, pod in named))
            self.orphans[command.job_id] = BoundJob(command, placement, names, bound_s)
            return None
        placement = Placement(command.job_id, tuple(replace(pod, node=self.index_of[name]) for name, pod in named))
        self.withdraw(command.job_id)
        self.scheduler.adopt(self._view(command, bound_s), command.request, placement, bound_s)  # re-checks every GPU
        return self._bound(command, placement, bound_s)

    def forget(self, job_id: str) -> None:
        """Drop a job from the book during a rebuild (it was released)."""
        self.orphans.pop(job_id, None)
        self.withdraw(job_id)
        self.release(job_id, 0)

    # ---- explain -----------------------------------------------------------------------------------
    def _why_waiting(self, job_id: str) -> PendingReason:
        reason = self.scheduler.explain(job_id)
        if reason is not None and reason.resource != "order":
            return reason
        # the pass did not start it although it fits: a job ahead of it or a reservation holds the room
        pending = self.pending[job_id]
        return PendingReason(
            job_id,
            "order",
            "waits behind jobs earlier in the queue policy's order",
            pending.command.request.pods[0].shape(),
        )

    def served_so_far(self, job_id: str) -> ServiceSoFar:
        """What its evicted attempts ran (`NOT_SERVED` before any was evicted or reported computing)."""
        return self.served.get(job_id, NOT_SERVED)

    def explain(self, job_id: str, now: float | None = None) -> Explanation:
        """Where a job stands and why, with what its evicted attempts ran and, while it waits, since when and when
        the policy's starvation guard acts for it, and its place among its queue's pending jobs in the order the
        policy starts them (`_queue_position`; `now` ranks those quota holds back, by arrival without it)."""
        served = self.served_so_far(job_id)
        job = self.bound.get(job_id)
        if job is not None and job_id in self.nominated:
            reasons = (self._nominated_reason(job.command),)
            return Explanation("pending", job.command.queue, reasons, 1, service=served)
        if job is None and job_id in self.draining:
            job = self.draining[job_id].job
            return Explanation("preempting", job.command.queue, job=job, service=served)
        if job is not None:
            return Explanation("bound", job.command.queue, job=job, service=served)
        pending = self.pending.get(job_id)
        if pending is None:
            return Explanation("unknown")
        reasons = (pending.reason,) if pending.held or not self.nodes else (self._why_waiting(job_id),)
        position = self._queue_position(pending, now)
        starvation_s = POLICIES[self.policy].starvation_s
        since = pending.waiting_since_s
        starves_at = since + starvation_s if starvation_s > 0 else None
        return Explanation("pending", pending.command.queue, reasons, position, None, since, starves_at, served)

    def _queue_position(self, pending: PendingJob, now: float | None) -> int:
        """1-based place among its queue's pending jobs: those in the scheduler's queue in the policy's order (tier,
        then its key: arrival for FIFO policies), then those quota holds back in the order quota is asked for them;
        by arrival before any node is known (no scheduler yet)."""
        queue = pending.command.queue
        if not self.nodes:
            same_queue = sorted((item for item in self.pending.values() if item.command.queue == queue), key=_arrival)
            return 1 + [item.command.job_id for item in same_queue].index(pending.command.job_id)
        queued = sorted(
            (entry.order, job_id) for job_id, entry in self.scheduler.waiting.items() if entry.view.queue == queue
        )
        order = [job_id for _, job_id in queued]
        if now is None:
            held = sorted((item for item in self.pending.values() if item.held), key=_arrival)
        else:
            held = self.held_jobs_in_order(now)
        order += [item.command.job_id for item in held if item.command.queue == queue]
        job_id = pending.command.job_id
        return 1 + order.index(job_id) if job_id in order else 1 + len(order)  # not queued yet: last

    def audit(self) -> list[str]:
        problems = self.state.audit()
        if set(self.bound) != set(self.state.allocations):
            problems.append("bound jobs and cluster allocations differ")
        if set(self.bound) != set(self.scheduler.running):
            problems.append("bound jobs and the scheduler's running jobs differ")
        for job_id, job in self.bound.items():
            if job_id not in self.nominated and self._on_draining(job.placement):
                problems.append(f"{job_id} started on GPUs a preempted job has not left")
        waiting = {job_id for job_id, job in self.pending.items() if not job.held}
        if waiting != set(self.scheduler.waiting):
            problems.append("pending jobs and the scheduler's queue differ")
        return problems


def _arrival(pending: PendingJob) -> tuple[int, float, str]:
    return (-pending.command.priority_tier, pending.submitted_s, pending.command.job_id)
