"""The discrete-event simulator: a clock, a cluster, and the scheduling core deciding everything.

The simulator is the only holder of each job's true duration (`SimJob.duration_s`). Policies get a
`JobView` (no duration) or, if they are `*-oracle`, an `OracleJobView`; the forecaster learns a run
time only when the job has finished. Deterministic: events are ordered by (time, sequence), and the
seed only drives synthetic inputs and tie-free choices.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from kumiki.quota.core import LifecycleState, QuotaConfig
from kumiki.sched.cluster import ClusterSpec, ClusterState
from kumiki.sched.forecasting import (
    JobFeatures,
    RuntimeForecaster,
    tell_progress,
    tell_started,
    tell_stopped,
)
from kumiki.sched.idle import IDLE_RECLAIM, IdleJob, WaitingFor, idle_victims, waiting_for_gpus
from kumiki.sched.jobs import CheckpointModel, JobView, OracleJobView, consolidated_gang
from kumiki.sched.policies import TIRESIAS_THRESHOLDS_GPU_S, QueuePolicy, admission_rank
from kumiki.sched.preemption import OnDemand
from kumiki.sched.scheduler import Decisions, Scheduler, Start
from kumiki.sim.gate import ForecastGate, GateConfig, PastJob
from kumiki.sim.jobs import JobResult, Sample, SimJob, SimJobSpec, SimResult
from kumiki.sim.progress import last_checkpoint, progress_after, run_wall
from kumiki.sim.quota import SimQuota, check_jobs, cluster_tree
from kumiki.sim.scenarios import IdleReclaim, OnDemandCheckpoint, ProgressReports, progress_marks

# the simulator's public names: the job specs and results live in `kumiki.sim.jobs`, and are taken from here too
__all__ = ["JobResult", "Sample", "SimConfig", "SimJobSpec", "SimResult", "Simulator"]

ARRIVAL, FINISH, RECHECK, GATE, WAKE, IDLE = 0, 1, 2, 3, 4, 5


@dataclass(frozen=True, slots=True)
class SimConfig:
    policy: QueuePolicy
    placement: str = "best-fit"
    checkpoint: CheckpointModel = field(default_factory=CheckpointModel)
    # None: today's periodic model (checkpoint every interval, lose progress since the last one)
    on_demand: OnDemandCheckpoint | None = None
    queue_shares: dict[str, float] | None = None
    sample_every_s: float = 600.0
    audit: bool = False
    # for policies that gate their forecasts (`gate_forecasts`): how often the gate looks and what it replays
    gate: GateConfig = field(default_factory=GateConfig)
    # None: no job reports its progress (a trace's jobs do not); otherwise which do, told to the forecaster
    progress_reports: ProgressReports | None = None
    # None: no quota service (every job queues at once); otherwise the queue tree quota admits against, with
    # the live stack's rules (`kumiki.sim.quota`)
    quota: QuotaConfig | None = None
    # when telemetry finds a zombie (`SimJobSpec.idle`) and which queues reclaim its GPUs (default: none do)
    idle: IdleReclaim = field(default_factory=IdleReclaim)


class Simulator:
    def __init__(
        self,
        spec: ClusterSpec,
        jobs: Sequence[SimJobSpec],
        config: SimConfig,
        *,
        forecaster: RuntimeForecaster | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        if config.policy.uses_forecast and forecaster is None:
            raise ValueError(f"policy {config.policy.name} needs a forecaster")
        self.spec = spec
        self.config = config
        self.policy = config.policy
        self.state = ClusterState.empty(spec)
        self.scheduler = Scheduler(
            config.policy,
            self.state,
            config.placement,
            checkpoint=config.checkpoint,
            queue_shares=config.queue_shares,
            # on demand a victim checkpoints when asked: the same victim-choice code sees no unsaved work at risk
            acknowledged=OnDemand() if config.on_demand is not None else None,
        )
        self.forecaster = forecaster if config.policy.uses_forecast else None
        self.gate: ForecastGate | None = None
        if self.forecaster is not None and config.policy.gate_forecasts:
            self.gate = ForecastGate(config.gate)
        self.progress = progress
        self.reporters: dict[str, float] = {}
        if self.forecaster is not None and config.progress_reports is not None:
            self.reporters = config.progress_reports.reporters(jobs)
        self.gpus_per_node = max(node.gpus for node in spec.nodes)
        self.quota: SimQuota | None = None
        if config.quota is not None:
            tree = cluster_tree(config.quota, spec.total_gpus)
            check_jobs(tree, ((job.job_id, job.queue, job.gpus) for job in jobs))
            self.quota = SimQuota(tree)
        self.jobs: dict[str, SimJob] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self.sequence = 0
        for job in jobs:
            if job.gpus > self.gpus_per_node * len(spec.nodes):
                raise ValueError(f"job {job.job_id} needs {job.gpus} GPUs, more than the cluster has")
            features = JobFeatures(
                job.job_id,
                job.queue,
                job.user,
                float(job.gpus),
                job.name,
                job.submit_s,
                job.image,
                job.command,
                job.time_limit_s,
            )
            request = consolidated_gang(job.job_id, job.gpus, self.gpus_per_node)
            self.jobs[job.job_id] = SimJob(job, features, job.duration_s, request, waiting_since_s=job.submit_s)
            self._push(job.submit_s, ARRIVAL, job.job_id, 0)
        self.results: list[JobResult] = []
        self.samples: list[Sample] = []
        self.next_sample_s = min((job.submit_s for job in jobs), default=0.0)
        if self.gate is not None and jobs:
            look_s, last_s = self.next_sample_s + self.gate.config.every_s, max(job.submit_s for job in jobs)
            while look_s <= last_s:
                self._push(look_s, GATE, "", 0)
                look_s += self.gate.config.every_s
        self.events_done = 0
        self.busy_gpu_s = 0.0
        self.idle_gpu_s = 0.0
        self.idle_found = self.idle_reclaimed = 0
        self.idle_due: dict[str, int] = {}  # zombie -> the attempt its queue's rule may now reclaim
        # beneficiaries of this instant's preemptions -> how long their victims still hold the GPUs (on demand, the
        # checkpoint's acknowledgement): a start in this instant waits that long. Idle reclaim evicts before the
        # pass that starts its beneficiary, so this outlives one `_apply`; cleared when the instant is done
        self.delayed: dict[str, float] = {}
        self.wake_s = -math.inf  # when the pending deadline pass runs

    def _push(self, time: float, kind: int, job_id: str, generation: int) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (time, kind, self.sequence, job_id, generation))

    # ---- what policies may see -----------------------------------------------------------------
    def view(self, job: SimJob) -> JobView:
        forecast = job.forecast if self.forecaster is not None else None
        if self.gate is not None and not self.gate.on:
            forecast = None
        common = dict(
            features=job.features,
            gpus=job.spec.gpus,
            queue=job.spec.queue,
            submit_s=job.spec.submit_s,
            executed_s=job.progress_s,
            attained_gpu_s=job.attained_gpu_s,
            preemptions=job.preemptions,
            forecast=forecast,
            idle_reclaims=job.idle_reclaims,
        )
        if self.policy.oracle:
            return OracleJobView(remaining_s=job.duration_s - job.progress_s, **common)  # type: ignore[arg-type]
        return JobView(**common)  # type: ignore[arg-type]

    # ---- the loop ------------------------------------------------------------------------------
    def run(self, *, until_s: float = math.inf) -> SimResult:
        """Run to the last event, or stop before the first event after `until_s` (unfinished jobs then have no
        result)."""
        events = self.events
        while events and events[0][0] <= until_s:
            now = events[0][0]
            self._sample_until(now)
            preempt_check = False
            changed = False
            rechecked: list[str] = []
            while events and events[0][0] == now:
                _, kind, _, job_id, generation = heapq.heappop(events)
                self.events_done += 1
                if kind == GATE:
                    if self._look(now):
                        changed = preempt_check = True
                    continue
                if kind == WAKE:
                    changed = changed or now == self.wake_s  # a wake a nearer deadline replaced is skipped
                    continue
                job = self.jobs[job_id]
                if kind == ARRIVAL:
                    self._arrive(job, now)
                    preempt_check = True
                    changed = True
                elif kind == FINISH and job.running and job.generation == generation:
                    self._finish(job, now)
                    changed = True
                elif kind == IDLE and job.running and job.generation == generation:
                    self.idle_due[job_id] = generation
                    changed = True
                elif kind == RECHECK and job.running and job.generation == generation:
                    changed = True
                    if self.policy.order == "gittins":
                        self._report_progress(job, now)
                        rechecked.append(job_id)
                        self._schedule_rank_check(job, now)
                    else:
                        preempt_check = True
            if changed:
                self._reclaim_idle(now)
                self._admit_held(now)
                decisions = self.scheduler.schedule(now, consider_preemption=preempt_check, recheck=rechecked)
                self._apply(decisions, now)
                moved = [p.job_id for p in decisions.preemptions if p.reason == "defragmentation"]
                if moved:
                    self._apply(self._restart_moved(moved, now), now)
                if self.config.audit:
                    problems = self.state.audit()
                    if problems:
                        raise AssertionError(f"t={now}: {problems}")
                self._wake_for_deadline(now)
                self.delayed.clear()
        self._sample_until(until_s)
        return SimResult(
            self.policy.name,
            self.spec.total_gpus,
            self.results,
            self.samples,
            self.events_done,
            self.busy_gpu_s,
            self.gate.looks if self.gate is not None else [],
            self.quota.summary() if self.quota is not None else None,
            self.idle_gpu_s,
            self.idle_found,
            self.idle_reclaimed,
        )

    def _wake_for_deadline(self, now: float) -> None:
        """Run a pass when the clock alone would change a decision (a job starving, a reservation's deadline).

        The live service passes every second; here passes follow events, and a trace may fall silent for
        hours while a job waits past the starvation limit."""
        deadline = self.scheduler.next_deadline(now)
        if deadline is not None and not now < self.wake_s <= deadline:
            self.wake_s = deadline
            self._push(deadline, WAKE, "", 0)

    def _look(self, now: float) -> bool:
        """The forecast gate replays the jobs submitted so far as they are known now (run times of the finished).

        When a switch flips, every waiting and running job is re-ranked at once under it (new arrivals alone
        would leave two orders mixed in one queue); True then, so the caller schedules."""
        assert self.gate is not None
        before = self.gate.on
        past = [
            PastJob(
                job_id,
                job.spec.queue,
                job.spec.gpus,
                job.spec.submit_s,
                job.forecast,
                job.duration_s if job.finish_s >= 0 else None,
            )
            for job_id, job in self.jobs.items()
            if job.forecast is not None and job.spec.submit_s < now
        ]
        self.gate.look(now, self.spec, past, self.config)
        if self.gate.on == before:
            return False
        present = [*self.scheduler.waiting, *self.scheduler.running]
        self.scheduler.reconsider([self.view(self.jobs[job_id]) for job_id in present])
        return True

    def _reclaim_idle(self, now: float) -> None:
        """Placement's idle reclaim: the zombies `kumiki.sched.idle.idle_victims` chooses, as `PlacementBook` evicts
        them. Who waits (queued, then held by quota) is read before any eviction, as placement's victims drain
        before they wait again."""
        if not self.idle_due:
            return
        idle: list[IdleJob] = []
        for job_id, generation in list(self.idle_due.items()):
            job = self.jobs[job_id]
            if not job.running or job.generation != generation:
                del self.idle_due[job_id]
            else:
                idle.append((job_id, job.spec.queue, now - job.run_start_s))

        preemptions = []
        for job_id, beneficiary in idle_victims(self.scheduler, idle, self.config.idle.rules, self._waiting_for_gpus):
            del self.idle_due[job_id]
            self.jobs[job_id].idle_reclaims += 1  # its next attempts wait behind the jobs that compute
            preemptions.append(self.scheduler.preempt(job_id, beneficiary, IDLE_RECLAIM, now))
        if preemptions:
            self.idle_reclaimed += len(preemptions)
            self._apply(Decisions(preemptions=preemptions), now)

    def _waiting_for_gpus(self) -> Iterable[WaitingFor]:
        """Who a zombie's GPUs may be reclaimed for: queued, then held by quota (`kumiki.sched.idle`)."""
        held = () if self.quota is None else self.quota.held
        jobs = self.jobs
        return waiting_for_gpus(self.scheduler, ((job, jobs[job].request, jobs[job].idle_reclaims > 0) for job in held))

    def _restart_moved(self, moved: Sequence[str], now: float) -> Decisions:
        """Jobs a defragmentation moved, queued again, restart elsewhere at once ahead of the queue order (they
        were not stopped for their rank; live placement does the same when it releases them)."""
        decisions = Decisions()
        for job_id in moved:
            placed = self.scheduler.start_waiting(job_id, now)
            if placed is not None:
                decisions.starts.append(Start(job_id, placed))
        return decisions

    def _arrive(self, job: SimJob, now: float) -> None:
        if self.forecaster is not None:
            job.forecast = self.forecaster.predict(job.features)
        self._enter(job, now)
        if self.progress is not None:
            self.progress(1)

    def _enter(self, job: SimJob, now: float) -> bool:
        """Queue an attempt, once quota admits it; victims it names for the job are preempted and the job
        starts on their GPUs ahead of the queue order, as placement starts the job a reclaim freed GPUs for."""
        quota = self.quota
        if quota is None:
            self.scheduler.submit(self.view(job), job.request, now=now)
            return True
        spec = job.spec
        admitted = quota.ask(
            spec.job_id, job.generation + 1, spec.queue, spec.gpus, self._rank(job, now), job.waiting_since_s
        )
        if admitted is None:
            return False
        self.scheduler.submit(self.view(job), job.request, now=job.waiting_since_s)  # its wait goes on in the queue
        decisions = Decisions()
        for victim in admitted.victims:
            if victim in self.scheduler.running:
                decisions.preemptions.append(self.scheduler.preempt(victim, job.spec.job_id, "quota-reclaim", now))
            elif self.scheduler.withdraw(victim):  # admitted, not started: it asks quota again
                held = self.jobs[victim]
                quota.hold(victim, held.spec.queue, held.spec.gpus, self._rank(held, now), held.waiting_since_s)
        if decisions.preemptions:
            placed = self.scheduler.start_waiting(job.spec.job_id, now)
            if placed is not None:
                decisions.starts.append(Start(job.spec.job_id, placed))
            self._apply(decisions, now)
        return True

    def _rank(self, job: SimJob, now: float) -> tuple[float, ...]:
        return admission_rank(self.policy, self.view(job), job.waiting_since_s, now)

    def _admit_held(self, now: float) -> None:
        """Quota is asked again for the held jobs in admission order (placement's cycle; `admission_rank`): before
        each pass, and after preemptions, whose victims' next generations wait here to be admitted."""
        if self.quota is not None:
            starvation_s = self.policy.starvation_s
            starving_before = now - starvation_s if starvation_s > 0 else -math.inf
            self.quota.ask_held(lambda job_id: self._enter(self.jobs[job_id], now), starving_before)

    def _wall_to_finish(self, job: SimJob) -> float:
        return job.overhead_s + run_wall(self.config.checkpoint, job.progress_s, job.duration_s, job.checkpoint_until_s)

    def _apply(self, decisions: Decisions, now: float) -> None:
        on_demand = self.config.on_demand
        for preemption in decisions.preemptions:
            self._preempted(self.jobs[preemption.job_id], now)
            if on_demand is not None:
                self.delayed[preemption.for_job] = on_demand.held_s
        for start in decisions.starts:
            job = self.jobs[start.job_id]
            job.running = True
            job.generation += 1
            job.run_start_s = now
            job.run_start_progress_s = job.progress_s
            job.overhead_s += self.delayed.pop(start.job_id, 0.0)
            if on_demand is not None or job.spec.idle:
                # no periodic checkpoints: on demand it writes one when asked, and a zombie has nothing to save
                job.checkpoint_until_s = 0.0
            else:
                job.checkpoint_until_s = self.scheduler.checkpoint_until(job.request, self.view(job))
            job.checkpointing = job.checkpoint_until_s > job.progress_s
            if job.first_start_s < 0:
                job.first_start_s = now
            if self.quota is not None:
                self.quota.started(start.job_id, job.generation, now)
            tell_started(self.forecaster, job.spec.job_id, now)
            self._push(now + self._wall_to_finish(job), FINISH, job.spec.job_id, job.generation)
            due_s = self.config.idle.due_after_s(job.spec.queue) if job.spec.idle else None
            if due_s is not None:  # stale, and skipped, if the attempt ends first
                self._push(now + due_s, IDLE, job.spec.job_id, job.generation)
            if self.policy.order in ("las", "las-forecast"):
                self._schedule_demotion(job, now)
            elif self.policy.order == "gittins":
                self._schedule_rank_check(job, now)
        if decisions.preemptions:
            self._admit_held(now)

    def _report_progress(self, job: SimJob, now: float) -> None:
        """A reporting job tells the forecaster how far it has got; the policy sees the forecast that gives."""
        factor = self.reporters.get(job.spec.job_id)
        if factor is None:
            return
        reached = min(self._progress_now(job, now), job.duration_s)
        if reached <= 0.0:
            return
        fraction = min(1.0, reached / (job.duration_s * factor))
        forecast = tell_progress(self.forecaster, job.spec.job_id, fraction, now)
        if forecast is not None:
            job.forecast = forecast
            self.scheduler.reconsider([self.view(job)])

    def _schedule_rank_check(self, job: SimJob, now: float) -> None:
        """A running job's Gittins rank moves as it runs; look again each time its progress doubles.

        Without this a job blocked at its arrival could only start when something finishes, even
        after the jobs in its way have run long enough to rank below it. The looks fall just after a
        checkpoint (progress of RANK_CHECK_FIRST_S x 2^k), when evicting the job loses the least, and
        one falls on the last checkpoint before the job stops checkpointing (its last chance to yield).
        """
        start = job.run_start_progress_s
        interval = self.config.checkpoint.interval_s
        marks = progress_marks(job.duration_s)
        until = job.checkpoint_until_s
        if job.checkpointing and until < math.inf:
            marks.append((math.ceil(until / interval) - 1) * interval)
        for mark in sorted(marks):
            if mark <= start or mark >= job.duration_s:
                continue
            wall = job.overhead_s + run_wall(self.config.checkpoint, start, mark, until)
            if job.checkpointing and mark < until:
                wall += self.config.checkpoint.checkpoint_cost_s
            if job.run_start_s + wall > now:
                self._push(job.run_start_s + wall, RECHECK, job.spec.job_id, job.generation)
                return

    def _schedule_demotion(self, job: SimJob, now: float) -> None:
        for threshold in TIRESIAS_THRESHOLDS_GPU_S:
            if job.attained_gpu_s < threshold:
                wall = job.overhead_s + (threshold - job.attained_gpu_s) / job.spec.gpus
                self._push(now + wall, RECHECK, job.spec.job_id, job.generation)
                return

    def _progress_now(self, job: SimJob, now: float) -> float:
        """Progress a running job has reached by `now` (its restore and checkpoint stops are not progress),
        not yet capped at its end."""
        useful = max(0.0, now - job.run_start_s - job.overhead_s)
        if job.checkpointing:
            return progress_after(self.config.checkpoint, job.run_start_progress_s, useful, job.checkpoint_until_s)
        return job.run_start_progress_s + useful

    def _stop(self, job: SimJob, now: float) -> float:
        """Account a run that ends now; returns progress reached."""
        wall = now - job.run_start_s
        progress = self._progress_now(job, now)
        if job.checkpointing:
            checkpoint_wall = max(0.0, wall - job.overhead_s) - (progress - job.run_start_progress_s)
            job.checkpoint_gpu_s += max(0.0, checkpoint_wall) * job.spec.gpus
        progress = min(progress, job.duration_s)
        job.run_wall_s += wall
        job.attained_gpu_s += wall * job.spec.gpus
        self.busy_gpu_s += wall * job.spec.gpus
        if job.spec.idle:
            self.idle_gpu_s += wall * job.spec.gpus
            self.idle_found += wall >= self.config.idle.found_after_s  # telemetry's rule: that long below threshold
        job.running = False
        return progress

    def _finish(self, job: SimJob, now: float) -> None:
        self._stop(job, now)
        job.progress_s = job.duration_s
        job.finish_s = now
        self.scheduler.finished(job.spec.job_id)
        if self.quota is not None:
            self.quota.ended(job.spec.job_id, job.generation, now, LifecycleState.COMPLETED)
        if self.forecaster is not None:
            self.forecaster.observe(job.features, job.duration_s, now)
        spec = job.spec
        self.results.append(
            JobResult(
                spec.job_id,
                spec.gpus,
                spec.queue,
                spec.submit_s,
                job.first_start_s,
                now,
                job.run_wall_s,
                job.preemptions,
                job.lost_gpu_s,
                job.checkpoint_gpu_s,
                job.duration_s,
                spec.idle,
            )
        )

    def _preempted(self, job: SimJob, now: float) -> None:
        tell_stopped(self.forecaster, job.spec.job_id, now)
        was_checkpointing = job.checkpointing
        reached = self._stop(job, now)
        on_demand = self.config.on_demand
        held_s = 0.0  # GPU time the victim holds after the decision, lost
        if job.spec.idle:  # it computed nothing, so it loses nothing: the time it holds GPUs for goes on counting
            kept = reached
            if on_demand is not None:  # asked to checkpoint too, it holds its GPUs idle until it answers
                self.busy_gpu_s += on_demand.held_s * job.spec.gpus
                self.idle_gpu_s += on_demand.held_s * job.spec.gpus
        elif on_demand is not None:
            # asked at `now`: it saves what it reached (held for the acknowledgement), or past the deadline
            # loses its whole run (held until the deadline); the held time is GPU time lost either way
            kept = reached if on_demand.answers else job.run_start_progress_s
            held_s = on_demand.held_s
            self.busy_gpu_s += held_s * job.spec.gpus
        else:
            # a run that took no checkpoints (its policy did not expect to preempt it) keeps nothing of itself
            start = job.run_start_progress_s
            kept = (
                max(last_checkpoint(self.config.checkpoint, reached, job.checkpoint_until_s), start)
                if was_checkpointing
                else start
            )
        restore = self.config.checkpoint.restore_cost_s
        job.lost_gpu_s += ((reached - kept) + held_s + restore) * job.spec.gpus
        job.progress_s = kept
        job.overhead_s = restore
        self._requeue(job, now)

    def _requeue(self, job: SimJob, now: float) -> None:
        """A preempted attempt ends its quota admission; the next generation waits to be admitted afresh, asked
        once the preemptions at hand are applied (`_apply`)."""
        job.preemptions += 1
        job.waiting_since_s = now
        if self.quota is not None:
            self.quota.ended(job.spec.job_id, job.generation, now, LifecycleState.PREEMPTED)
            spec = job.spec
            self.quota.hold(spec.job_id, spec.queue, spec.gpus, self._rank(job, now), job.waiting_since_s)
            job.generation += 1
            return
        job.generation += 1
        self.scheduler.submit(self.view(job), job.request, now=now)

    # ---- time series ---------------------------------------------------------------------------
    def _sample_until(self, now: float) -> None:
        while self.next_sample_s <= now and (self.scheduler.waiting or self.scheduler.running or now < math.inf):
            if now == math.inf and not self.scheduler.running and not self.scheduler.waiting:
                break
            self.samples.append(self._sample(self.next_sample_s))
            self.next_sample_s += self.config.sample_every_s

    def _sample(self, time: float) -> Sample:
        state = self.state
        allocated = self.spec.total_gpus - state.free_whole
        waiting = self.scheduler.waiting
        held = len(self.quota.held) if self.quota is not None else 0
        fragmented = 0
        if waiting:
            smallest = min(
                entry.shape[0] if len(entry.shape) == 1 else self.gpus_per_node for entry in waiting.values()
            )
            fragmented = sum(level * len(state.by_free[level]) for level in range(1, min(smallest, state.max_gpus + 1)))
        return Sample(time, allocated, len(waiting) + held, fragmented)
