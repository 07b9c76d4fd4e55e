"""The scheduling pass: ordering, reservation, backfill and preemption over one cluster state.

This is the decision core the simulator and the live placement service drive: it owns the waiting queue and is
the single writer of allocations (`ClusterState.allocate`). It is pure in the functional-core sense: no I/O, no
clock (time is passed in), deterministic. What the pass decides it carries out here; how it plans lives beside
it, one module per concept: `reserving` (which nodes a blocked job is promised), `victims` (whom a blocked job
evicts), `moves` (defragmentation).

Waiting jobs sit in sorted lists per (lane, gang shape); a lane is a queue when fair share is on,
else there is one lane. A pass merges the heads of those lists, so a shape that cannot fit is
skipped whole instead of job by job: the pass costs O(starts + shapes), not O(waiting jobs).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from kumiki.sched.cluster import ClusterState, Placement
from kumiki.sched.jobs import CheckpointModel, GangRequest, JobView
from kumiki.sched.moves import plan_move, trial_move
from kumiki.sched.placement import PendingReason, place_gang
from kumiki.sched.policies import QueuePolicy, estimate_remaining, waiting_key
from kumiki.sched.preemption import lost_work
from kumiki.sched.reserving import Reservation, plan_reservation, room_at
from kumiki.sched.victims import choose_victims

__all__ = [
    "BACKFILL_LOOKAHEAD",
    "MIN_RUN_BEFORE_PREEMPT_S",
    "PREEMPTION_ATTEMPTS",
    "Decisions",
    "Preemption",
    "Reservation",
    "RunningJob",
    "Scheduler",
    "Start",
    "WaitingJob",
]

# How many jobs of one shape a pass may look past when they fit but may not use reserved nodes.
BACKFILL_LOOKAHEAD = 32
# How many blocked waiting jobs one pass tries to make room for by preemption.
PREEMPTION_ATTEMPTS = 1
# A job is not preempted again within this many seconds of (re)starting: no thrashing.
MIN_RUN_BEFORE_PREEMPT_S = 600.0


@dataclass(frozen=True, slots=True)
class Start:
    job_id: str
    placement: Placement
    borrower: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    """A job evicted by the pass. `reason`: "priority", "rank", "starvation", "reservation deadline" or
    "defragmentation" (moved off a node a gang needs; it is queued again and placed elsewhere)."""

    job_id: str
    for_job: str
    reason: str
    lost_gpu_s: float = 0.0  # its unsaved work (since its last checkpoint) x GPUs, when decided
    since_checkpoint_s: float = 0.0  # seconds of unsaved work


@dataclass(slots=True)
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)


@dataclass(slots=True)
class WaitingJob:
    view: JobView
    request: GangRequest
    key: tuple[float, float, int]
    lane: str
    shape: tuple[int, ...]

    @property
    def order(self) -> _Order:
        """Place in its list: a higher priority tier is always ahead, then a job idle reclaim has not evicted,
        then the policy's key. An evicted idle job ordered by the key alone came back first under FIFO (its
        arrival) and Tiresias (its first level): it took back the GPUs it gave up (docs/design/0018)."""
        return (-self.view.priority, self.view.demoted, self.key)


# a waiting list's sort key, and a list head in a pass: (tier, lane priority, order, job, position, list)
_Order = tuple[int, int, tuple[float, float, int]]
_Head = tuple[int, float, _Order, str, int, tuple[str, tuple[int, ...]]]


@dataclass(slots=True)
class RunningJob:
    view: JobView
    request: GangRequest
    placement: Placement
    start_s: float
    gpus: int
    borrower_of: str = ""
    nodes: tuple[int, ...] = ()


class Scheduler:
    """Owns the waiting queue and the allocations of one cluster under one policy."""

    def __init__(
        self,
        policy: QueuePolicy,
        state: ClusterState,
        strategy: str,
        *,
        checkpoint: CheckpointModel | None = None,
        queue_shares: dict[str, float] | None = None,
        min_run_s: float = MIN_RUN_BEFORE_PREEMPT_S,
        acknowledged: Mapping[str, float] | None = None,
    ) -> None:
        """`min_run_s`: a job is not preempted again within this long of (re)starting. `acknowledged`: when given,
        lost work is measured from each job's newest acknowledged checkpoint (wall time, job id -> s; live and
        the simulator's on-demand model) instead of the periodic checkpoint model."""
        self.min_run_s = min_run_s
        self.acknowledged = acknowledged
        self.policy = policy
        self.state = state
        self.strategy = strategy
        self.checkpoint = checkpoint or CheckpointModel()
        self.shares = dict(queue_shares or {})
        self.waiting: dict[str, WaitingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.lists: dict[tuple[str, tuple[int, ...]], list[tuple[_Order, str]]] = {}
        # per shape: (when the job joined the queue, arrival order, job): the longest waiting first
        self.by_queued: dict[tuple[int, ...], list[tuple[float, int, str]]] = {}
        self.lane_usage: dict[str, float] = {}
        self.on_node: list[set[str]] = [set() for _ in state.spec.nodes]
        self.reservation: Reservation | None = None
        self.sequence = 0

    # ---- queue bookkeeping ---------------------------------------------------------------------
    def lane_of(self, view: JobView) -> str:
        return view.queue if self.shares else ""

    def submit(self, view: JobView, request: GangRequest, *, now: float | None = None) -> None:
        """Queue a job (new or requeued after preemption); `view` must not carry more than the policy may see.

        `now`: when it joins the queue (default: its submit time); starvation counts from then.
        """
        if view.job_id in self.waiting or view.job_id in self.running:
            raise ValueError(f"job {view.job_id} is already queued or running")
        self.sequence += 1
        key = (waiting_key(self.policy, view), view.submit_s, self.sequence)
        shape = request.shape
        entry = WaitingJob(view, request, key, self.lane_of(view), shape)
        self.waiting[view.job_id] = entry
        bisect.insort(self.lists.setdefault((entry.lane, shape), []), (entry.order, view.job_id))
        queued_s = view.submit_s if now is None else now
        heapq.heappush(self.by_queued.setdefault(shape, []), (queued_s, self.sequence, view.job_id))

    def reconsider(self, views: Sequence[JobView]) -> None:
        """Replace what the policy sees of waiting and running jobs (a forecast switched on or off), re-ranking
        the waiting ones in place: their arrival order and the time they have waited (starvation) are kept."""
        for view in views:
            job_id = view.job_id
            if job_id in self.waiting:
                entry = self._unqueue(job_id)
                entry.view = view
                entry.key = (waiting_key(self.policy, view), view.submit_s, entry.key[2])
                self.waiting[job_id] = entry
                bisect.insort(self.lists[(entry.lane, entry.shape)], (entry.order, job_id))
            elif job_id in self.running:
                self.running[job_id].view = view

    def _unqueue(self, job_id: str) -> WaitingJob:
        entry = self.waiting.pop(job_id)
        items = self.lists[(entry.lane, entry.shape)]
        index = bisect.bisect_left(items, (entry.order, job_id))
        del items[index]
        return entry

    def finished(self, job_id: str) -> None:
        entry = self.running.pop(job_id)
        self._release(job_id, entry)

    def _release(self, job_id: str, entry: RunningJob) -> None:
        self.state.release(job_id)
        for node in entry.nodes:
            self.on_node[node].discard(job_id)
        lane = self.lane_of(entry.view)
        self.lane_usage[lane] = self.lane_usage.get(lane, 0.0) - entry.gpus

    def _start(
        self,
        entry: WaitingJob,
        placement: Placement,
        now: float,
        decisions: Decisions,
        borrower: str,
    ) -> None:
        self._unqueue(entry.view.job_id)
        self._run(entry.view, entry.request, placement, now, borrower)
        decisions.starts.append(Start(entry.view.job_id, placement, bool(borrower)))

    def _run(self, view: JobView, request: GangRequest, placement: Placement, now: float, borrower: str) -> None:
        """Allocate and account a job that starts now (or, adopted, already runs)."""
        self.state.allocate(placement)
        gpus = placement.whole_gpus
        nodes = placement.nodes
        self.running[view.job_id] = RunningJob(view, request, placement, now, gpus, borrower, nodes)
        for node in nodes:
            self.on_node[node].add(view.job_id)
        lane = self.lane_of(view)
        self.lane_usage[lane] = self.lane_usage.get(lane, 0.0) + gpus

    def may_preempt(self, request: GangRequest, view: JobView) -> bool:
        """Whether this policy could ever preempt the job (only then does it need periodic checkpoints)."""
        return self.checkpoint_until(request, view) > 0.0

    def checkpoint_until(self, request: GangRequest, view: JobView) -> float:
        """Progress (s) up to which the job checkpoints, because until then this policy may preempt it.

        0: never (non-preemptive policies, multi-node gangs); inf: always. A protected full-node job
        checkpoints only during its first `protect_after_s` (then it is never preempted again).
        """
        if not self.policy.preemptive or not view.preemptible or len(request.pods) > 1:
            return 0.0
        if self.policy.protect_full_nodes and request.pods[0].gpus >= self.state.max_gpus:
            return self.policy.protect_after_s
        return math.inf

    def young_full_node(self, running: RunningJob, executed: float) -> bool:
        """A protected full-node job that takes no checkpoints may still yield before its first would be due.

        It never writes a checkpoint, so yielding then loses all its progress, at most one interval.
        """
        return (
            self.policy.protect_full_nodes
            and not self.policy.protect_after_s
            and running.view.preemptible
            and len(running.nodes) == 1
            and executed < self.checkpoint.interval_s
        )

    def executed(self, entry: RunningJob, now: float) -> float:
        return entry.view.executed_s + (now - entry.start_s)

    # ---- the pass ------------------------------------------------------------------------------
    def fits_shape(self, shape: tuple[int, ...]) -> bool:
        """Necessary condition from the free-GPU index alone (cheap): the largest pod finds a node, and the nodes
        that could hold the smallest have the GPUs of all of them. Pods of one gang may share a node, so this
        must not ask for a node per pod: a gang of two 2-GPU pods fits one free 8-GPU node."""
        by_free = self.state.by_free
        top = self.state.max_gpus
        if not any(by_free[level] for level in range(shape[0], top + 1)):
            return False
        if len(shape) == 1:
            return True
        usable = sum(level * len(by_free[level]) for level in range(max(shape[-1], 1), top + 1))
        return usable >= sum(shape)

    def span(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """(GPUs needed per node, nodes) to make room for a gang: one node for all of it when its pods fit the
        largest node together (two 2-GPU pods are a 4-GPU job to reserve or preempt for), else a node per pod of
        the largest pod's size (whole-node gangs)."""
        total = sum(shape)
        if len(shape) == 1 or total <= self.state.max_gpus:
            return total, 1
        return shape[0], len(shape)

    def schedule(self, now: float, *, consider_preemption: bool = False, recheck: Collection[str] = ()) -> Decisions:
        """One scheduling pass. `consider_preemption`: blocked jobs may evict lower-ranked ones anywhere;
        `recheck`: running jobs whose rank has moved, so a blocked job may evict them (their nodes only)."""
        decisions = Decisions()
        if not self.waiting:
            self.reservation = None
            return decisions
        self._refresh_reservation(now, decisions)
        starving = self._starving(now)
        # a reservation holds until its job starts (switching targets would drain nodes for nobody);
        # only a starving job may take over one made for an ordinary blocked head
        if starving is not None and (self.reservation is None or not self.reservation.starving):
            self._reserve(self.waiting[starving], now, starving=True)
        # a higher priority tier outranks any reservation, and a job idle reclaim has not evicted one made for a
        # job it has: the pass below reserves for it if it is blocked
        if self.reservation is not None and self._outranked(self.waiting[self.reservation.job_id].view):
            self.reservation = None
        # the reserved job goes first: it may sit deep in a list whose head cannot start
        if self.reservation is not None:
            target = self.waiting[self.reservation.job_id]
            placed = place_gang(self.state, target.request, self.strategy, explain=False)
            if not isinstance(placed, PendingReason):
                self._start(target, placed, now, decisions, "")
                self.reservation = None
            elif (
                self.reservation.starving
                and self.policy.preemptive
                and (self.span(target.shape)[0] >= self.state.max_gpus or self.policy.starvation_preempts)
            ):
                # a starving job stops waiting: preempt on one node, rank margins aside (`_preempt_for` says whom)
                self._preempt_for(target, now, decisions, force=True)
                if target.view.job_id not in self.waiting:
                    self.reservation = None
        unfit: list[str] = []
        heads = self._heads()
        while heads and self.waiting:
            _, _, _, job_id, position, list_key = heapq.heappop(heads)
            entry = self.waiting[job_id]
            placement = self._try_place(entry, now)
            if isinstance(placement, tuple):
                placed, borrower = placement
                self._start(entry, placed, now, decisions, borrower)
                if self.reservation is not None and self.reservation.job_id == job_id:
                    self.reservation = None
                self._push_head(heads, list_key, position)  # the list shifted left by one
                continue
            if placement == "physically":
                if self.policy.strict:
                    break
                if self.policy.reserve and self.reservation is None:
                    self._reserve(entry, now)
            # blocked, whether it fits nowhere or only on reserved nodes: either way it may evict a worse-ranked
            # job off the unreserved nodes (`_preempt_for` skips reserved ones). Counting only the first kind let
            # free GPUs held for a drain switch rank preemption off everywhere (docs/design/0003, eighteenth step).
            if len(unfit) < PREEMPTION_ATTEMPTS:
                unfit.append(job_id)
            if placement in ("physically", "shape"):
                continue
            # fits, but only on reserved nodes and this job is too long: look a little further down
            if position + 1 < min(len(self.lists[list_key]), BACKFILL_LOOKAHEAD):
                self._push_head(heads, list_key, position + 1)
        if self.policy.preemptive and (consider_preemption or recheck):
            nodes = None if consider_preemption else self._nodes_of(recheck)
            for job_id in unfit:
                # moving small jobs elsewhere costs less than stopping one, so it is tried first
                if job_id in self.waiting and self.policy.defragment:
                    self._defragment_for(self.waiting[job_id], now, decisions)
                if job_id in self.waiting:
                    self._preempt_for(self.waiting[job_id], now, decisions, nodes=nodes)
        return decisions

    def _heads(self) -> list[_Head]:
        heads: list[_Head] = []
        for list_key, items in self.lists.items():
            if items:
                heads.append(self._head(list_key, 0))
        heapq.heapify(heads)
        return heads

    def _outranked(self, view: JobView) -> bool:
        """Whether a job waits that the order puts ahead of `view` whatever the policy's key: of a higher tier, or
        of its tier and not evicted by idle reclaim when it was."""
        rank = (-view.priority, view.demoted)
        return any(items and items[0][0][:2] < rank for items in self.lists.values())

    def _lane_priority(self, lane: str) -> float:
        if not self.shares:
            return 0.0
        share = self.shares.get(lane, 0.0)
        used = self.lane_usage.get(lane, 0.0)
        # queues under their guarantee first (deficit), then by usage relative to guarantee
        return used / share if share > 0 else float("inf")

    def _head(self, list_key: tuple[str, tuple[int, ...]], position: int) -> _Head:
        order, job_id = self.lists[list_key][position]
        lane = list_key[0]
        return (order[0], self._lane_priority(lane), order, job_id, position, list_key)

    def _push_head(
        self,
        heads: list[_Head],
        list_key: tuple[str, tuple[int, ...]],
        position: int,
    ) -> None:
        if position < len(self.lists[list_key]):
            heapq.heappush(heads, self._head(list_key, position))

    def _try_place(self, entry: WaitingJob, now: float) -> tuple[Placement, str] | str:
        """A placement (and whose reservation it borrows from), or why not.

        'physically': does not fit the free capacity; 'shape': fits only on reserved nodes and the
        policy cannot tell whether it would leave in time (so neither can any job of its shape);
        'reserved': this job's forecast ends after the reservation starts (a shorter one might not).
        """
        if not self.fits_shape(entry.shape):
            return "physically"
        reservation = self.reservation
        request = entry.request
        if reservation is None or reservation.job_id == entry.view.job_id:
            result = place_gang(self.state, request, self.strategy, explain=False)
            return "physically" if isinstance(result, PendingReason) else (result, "")
        result = place_gang(self.state, request, self.strategy, excluded_nodes=reservation.nodes, explain=False)
        if not isinstance(result, PendingReason):
            return result, ""
        if not self.policy.backfill_on_reserved:
            return "shape"
        end = now + estimate_remaining(self.policy, entry.view, entry.view.executed_s, pessimistic=True)
        if end > reservation.shadow_s:
            return "reserved"
        anywhere = place_gang(self.state, request, self.strategy, explain=False)
        return "physically" if isinstance(anywhere, PendingReason) else (anywhere, reservation.job_id)

    def explain(self, job_id: str) -> PendingReason | None:
        """Why a waiting job is not running (None if it is not waiting); for an Explain call."""
        entry = self.waiting.get(job_id)
        if entry is None:
            return None
        result = place_gang(self.state, entry.request, self.strategy, excluded_nodes=self.reserved_for_others(job_id))
        if isinstance(result, PendingReason):
            return result
        return PendingReason(job_id, "order", "fits now; starts at the next scheduling pass", str(entry.shape))

    # ---- reservation (`kumiki.sched.reserving`) ---------------------------------------------------
    def reserved_for_others(self, job_id: str) -> frozenset[int]:
        """The nodes held for another job's reservation: `job_id` may not start there (only borrow them)."""
        reservation = self.reservation
        if reservation is None or reservation.job_id == job_id:
            return frozenset()
        return reservation.nodes

    def _reserve(self, entry: WaitingJob, now: float, *, starving: bool = False) -> None:
        """Reserve for `entry` the nodes that should free up first; unchanged when too few could ever take it."""
        planned = plan_reservation(self, entry, now, starving=starving)
        if planned is not None:
            self.reservation = planned

    def next_deadline(self, now: float) -> float | None:
        """The next time after `now` at which a pass would act on the clock alone, with nothing arrived or ended.

        That is a waiting job reaching the starvation limit, or the reserved job's shadow time (its borrowers
        are evicted then). A caller that runs passes only on events (the simulator) runs one at this time, or a
        trace with a silent gap would leave a starving job waiting for the next arrival."""
        deadlines = [starves_s for _, heap in self._queued_heads() if (starves_s := self._starves_at(heap)) > now]
        borrowers_leave_s = self._borrowers_deadline()
        if borrowers_leave_s is not None and borrowers_leave_s > now:
            deadlines.append(borrowers_leave_s)
        return min(deadlines, default=None)

    def _queued_heads(self) -> Iterator[tuple[tuple[int, ...], list[tuple[float, int, str]]]]:
        """Each shape's queue-time heap, its head a waiting job's current entry; none without a starvation limit.

        Entries of jobs that left are dropped here, and so are those of an earlier queueing of a job queued again
        (started, then preempted): its wait counts from the last time it joined the queue."""
        if not self.policy.starvation_s:
            return
        for shape, heap in self.by_queued.items():
            while heap and not self._queued_now(heap[0]):
                heapq.heappop(heap)
            if heap:
                yield shape, heap

    def _queued_now(self, queued: tuple[float, int, str]) -> bool:
        entry = self.waiting.get(queued[2])
        return entry is not None and entry.key[2] == queued[1]

    def _starves_at(self, heap: list[tuple[float, int, str]]) -> float:
        """When the head of a queue-time heap reaches the starvation limit (one sum, so the pass the simulator
        runs at this time finds the job starving)."""
        return heap[0][0] + self.policy.starvation_s

    def _starving(self, now: float) -> str | None:
        # the starving job whose wait holds the most GPU capacity back: large gangs first
        best: tuple[float, str] | None = None
        for shape, heap in self._queued_heads():
            if now >= self._starves_at(heap):
                weight = (now - heap[0][0]) * sum(shape)
                if best is None or weight > best[0]:
                    best = (weight, heap[0][2])
        if best is not None:
            return best[1]
        return None

    def _borrowers_deadline(self) -> float | None:
        """When the reserved job's borrowers must leave (its shadow time); None where the policy lends no reserved
        nodes or nothing is reserved for a waiting job."""
        reservation = self.reservation
        if reservation is None or reservation.job_id not in self.waiting or not self.policy.backfill_on_reserved:
            return None
        return reservation.shadow_s

    def _refresh_reservation(self, now: float, decisions: Decisions) -> None:
        reservation = self.reservation
        if reservation is None:
            return
        if reservation.job_id not in self.waiting:
            self.reservation = None
            return
        # the reserved job's time has come: borrowers that overstayed their forecast make room
        borrowers_leave_s = self._borrowers_deadline()
        if borrowers_leave_s is not None and now >= borrowers_leave_s:
            entry = self.waiting[reservation.job_id]
            if isinstance(place_gang(self.state, entry.request, self.strategy), PendingReason):
                borrowers = [
                    job_id
                    for node in sorted(reservation.nodes)
                    for job_id in sorted(self.on_node[node])
                    if self.running[job_id].borrower_of == reservation.job_id
                ]
                for job_id in dict.fromkeys(borrowers):
                    self._evict(job_id, reservation.job_id, "reservation deadline", decisions)
                if not borrowers:
                    need = self.span(entry.shape)[0]
                    shadow = max(room_at(self, node, need, now, pessimistic=True) for node in reservation.nodes)
                    self.reservation = replace(reservation, shadow_s=max(shadow, now))

    # ---- preemption ----------------------------------------------------------------------------
    def _evict(
        self,
        job_id: str,
        for_job: str,
        reason: str,
        decisions: Decisions,
        lost_gpu_s: float = 0.0,
        since_s: float = 0.0,
    ) -> None:
        entry = self.running.pop(job_id)
        self._release(job_id, entry)
        decisions.preemptions.append(Preemption(job_id, for_job, reason, lost_gpu_s, since_s))

    def lost_work(self, job_id: str, now: float) -> tuple[float, float]:
        """(unsaved seconds, unsaved GPU-seconds) of a running job now, by the scheduler's checkpoint model."""
        running = self.running[job_id]
        lost = lost_work(job_id, running.start_s, self.executed(running, now), now, self.checkpoint, self.acknowledged)
        return lost.since_checkpoint_s, lost.since_checkpoint_s * running.gpus

    def over_quota(self, view: JobView) -> bool:
        if not self.shares:
            return False
        lane = self.lane_of(view)
        return self.lane_usage.get(lane, 0.0) > self.shares.get(lane, 0.0)

    def _nodes_of(self, job_ids: Collection[str]) -> list[int]:
        running = self.running
        return sorted({node for job_id in job_ids if job_id in running for node in running[job_id].nodes})

    def _preempt_for(
        self,
        entry: WaitingJob,
        now: float,
        decisions: Decisions,
        *,
        force: bool = False,
        nodes: Sequence[int] | None = None,
    ) -> None:
        """Free one node for a job that fits one from the jobs `choose_victims` names (only on `nodes` if given),
        and start it there."""
        chosen = choose_victims(self, entry, now, force=force, nodes=nodes)
        if not chosen:
            return
        for job_id, lost_gpu_s, since, reason in chosen:
            self._evict(job_id, entry.view.job_id, reason, decisions, lost_gpu_s, since)
        # on the room just made: a reserved node's free GPUs stay with the drain
        reserved = self.reserved_for_others(entry.view.job_id)
        placed = place_gang(self.state, entry.request, self.strategy, excluded_nodes=reserved, explain=False)
        if not isinstance(placed, PendingReason):
            self._start(entry, placed, now, decisions, "")

    # ---- defragmentation (`kumiki.sched.moves`) -----------------------------------------------------
    def _defragment_for(self, entry: WaitingJob, now: float, decisions: Decisions) -> None:
        """Move small jobs off the nodes a gang blocked only by fragmentation needs, when the value test says it
        pays: they are preempted (reason "defragmentation": checkpoint, evict, queued again, placed elsewhere
        by the next pass) and the gang starts on the freed nodes."""
        move = plan_move(self, entry.view.job_id, now)
        if move is None or not move[2].worth:
            return
        targets, moved, _ = move
        placed = trial_move(self, entry, targets, [job_id for job_id, _, _ in moved])
        if placed is None:
            return
        for job_id, gpus, unsaved in moved:
            since = unsaved.since_checkpoint_s
            self._evict(job_id, entry.view.job_id, "defragmentation", decisions, since * gpus, since)
        self._start(entry, placed, now, decisions, "")

    # ---- live use: the placement service drives the same scheduler over a real cluster ------------
    def adopt(self, view: JobView, request: GangRequest, placement: Placement, now: float) -> None:
        """Take in a job that already runs (rebuilt from the event log); its allocation is re-checked."""
        if view.job_id in self.waiting or view.job_id in self.running:
            raise ValueError(f"job {view.job_id} is already queued or running")
        self._run(view, request, placement, now, "")

    def preempt(self, job_id: str, for_job: str, reason: str, now: float) -> Preemption:
        """Evict one running job for a reason decided outside the pass (idle reclaim), measuring its lost work."""
        since, lost_gpu_s = self.lost_work(job_id, now)
        decisions = Decisions()
        self._evict(job_id, for_job, reason, decisions, lost_gpu_s, since)
        return decisions.preemptions[0]

    def start_waiting(self, job_id: str, now: float) -> Placement | None:
        """Start one waiting job now if it fits, ahead of the queue order: the job capacity was freed for (a
        reclaim's beneficiary). None if it is not waiting or does not fit."""
        entry = self.waiting.get(job_id)
        if entry is None:
            return None
        placed = place_gang(self.state, entry.request, self.strategy, explain=False)
        if isinstance(placed, PendingReason):
            return None
        self._start(entry, placed, now, Decisions(), "")
        if self.reservation is not None and self.reservation.job_id == job_id:
            self.reservation = None
        return placed

    def withdraw(self, job_id: str) -> bool:
        """Take a waiting job out of the queue (cancelled before it started); False if it was not waiting."""
        if job_id not in self.waiting:
            return False
        self._unqueue(job_id)
        if self.reservation is not None and self.reservation.job_id == job_id:
            self.reservation = None
        return True
