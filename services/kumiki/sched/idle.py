"""Idle-GPU reclaim rules per queue: what a queue does with a job whose GPUs telemetry reports idle.

Placement applies them to telemetry's findings (kumiki.gpu.idle) and the simulator to its zombie jobs, both
through `idle_victims`, so the two decide alike. A job it evicted then waits behind the jobs of its tier it has
not (`JobView.demoted`, in the scheduler's order), and no idle job is reclaimed for it (`waiting_for_gpus`) until
an attempt of it is found computing."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kumiki.sched.jobs import GangRequest
    from kumiki.sched.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """What a queue does with a job whose GPUs telemetry reports idle (kumiki.gpu.idle): `never` reclaim it,
    reclaim it `after` `idle_s` seconds idle, or only when someone `waiting` could use the GPUs."""

    mode: str = "never"
    idle_s: float = 0.0

    def may_reclaim(self, idle_for_s: float) -> bool:
        """Whether a job idle this long is past the rule's time (under `waiting`, it then goes only for a job)."""
        return self.mode != "never" and idle_for_s >= self.idle_s

    def reclaims(self, idle_for_s: float, someone_to_use_it: bool) -> bool:
        """Whether a job idle this long is reclaimed now: past the rule's time, and under `waiting` only if a
        job waits that would use its GPUs (`idle_victims` says which)."""
        return self.may_reclaim(idle_for_s) and (self.mode == "after" or someone_to_use_it)


IDLE_MODES = ("never", "after", "waiting")
IDLE_RECLAIM = "idle-reclaim"  # the preemption reason of its evictions


def rule_for(rules: Mapping[str, IdlePolicy], queue: str) -> IdlePolicy:
    """The queue's own rule, else the `*` rule, else never."""
    return rules.get(queue) or rules.get("*") or IdlePolicy()


# an idle job telemetry reported: (job, its queue, seconds idle so far); it must be running
IdleJob = tuple[str, str, float]
# a job waiting for GPUs: (job, its gang, whether quota holds it back rather than the scheduler queuing it)
WaitingFor = tuple[str, "GangRequest", bool]
# a job quota holds back: (job, its gang, whether idle reclaim evicted it and no later attempt computed: demoted)
HeldJob = tuple[str, "GangRequest", bool]


def waiting_for_gpus(scheduler: Scheduler, held: Iterable[HeldJob]) -> Iterator[WaitingFor]:
    """Who waits for GPUs that an idle job's could serve, in the order each would get them: the scheduler's queue
    in its policy's order (a higher tier first; its lists, each sorted already, merged as they are read), then the
    jobs quota holds back (`held`, in admission order). Lazy: a reclaim that has found its room reads no further.

    A demoted job (idle reclaim evicted it, and no attempt of it has computed since) is no one to reclaim for: it
    would take an idle job's GPUs to hold them idle in turn, and the idle job it displaced would wait to do the same.
    In the simulator that chain was most of all reclaims (50 of 63 on the replay's excerpt)."""
    queued = (
        (job, waiting.request, False)
        for _, job in heapq.merge(*scheduler.lists.values())
        if not (waiting := scheduler.waiting[job]).view.demoted
    )
    return itertools.chain(queued, ((job, gang, True) for job, gang, demoted in held if not demoted))


def idle_victims(
    scheduler: Scheduler,
    idle: Iterable[IdleJob],
    rules: Mapping[str, IdlePolicy],
    waiting: Callable[[], Iterable[WaitingFor]],
) -> list[tuple[str, str]]:
    """(job to reclaim, the waiting job it makes room for, or "") for each idle job its queue's rule reclaims now;
    placement and the simulator both evict exactly these.

    `after` reclaims once the job has been idle long enough. `waiting` reclaims only for a waiting job that the
    GPUs would let start: `waiting` (queued, then held by quota, each in the order it starts; read only when a
    rule needs it) is walked in order, and a job that does not fit now but would on a node once idle jobs there
    leave takes the fewest of them (a gang over several nodes, on as many nodes as it needs). A job quota holds
    back that fits already takes one: quota is what holds it, and a reclaim returns the idle job's GPUs to what
    quota may lend. Reclaiming for anyone waiting, as before, evicted a one-GPU zombie for an eight-GPU gang it
    could not make room for: the zombie restarted at once and paid its restore, over and over. Reservations, CPU
    and memory are not weighed."""
    chosen: dict[str, str] = {}
    pool: dict[str, Counter[int]] = {}  # idle jobs `waiting` may reclaim: their GPUs per node
    for job_id, queue, idle_for_s in idle:
        rule = rule_for(rules, queue)
        if rule.may_reclaim(idle_for_s):
            if rule.mode == "after":
                chosen[job_id] = ""
            else:
                pool[job_id] = _gpus_by_node(scheduler, job_id)
    if pool:
        freed: Counter[int] = Counter()
        for job_id in chosen:
            freed += _gpus_by_node(scheduler, job_id)
        room = _Room(scheduler, freed, pool)
        for candidate, request, held in waiting():
            for job_id in room.make_for(request, held):
                chosen[job_id] = candidate
            if not room.pool:
                break
    return list(chosen.items())


def _gpus_by_node(scheduler: Scheduler, job_id: str) -> Counter[int]:
    return Counter(pod.node for pod in scheduler.running[job_id].placement.pods for _ in pod.gpus)


class _Room:
    """Free GPUs per node, counting those of the idle jobs already chosen as free, and the idle jobs `waiting` may
    still reclaim (`pool`, their GPUs per node), indexed by node once per change rather than once per waiting job."""

    def __init__(self, scheduler: Scheduler, freed: Counter[int], pool: dict[str, Counter[int]]) -> None:
        self.scheduler = scheduler
        self.freed = freed
        self.pool = pool
        self._index()

    def _index(self) -> None:
        self.ready: dict[int, int] = {}  # GPUs per node -> nodes with that many free now (filled as asked)
        self.on_node: dict[int, list[tuple[int, str]]] = {}  # node -> (GPUs, idle job) there, most GPUs first
        for job_id, by_node in self.pool.items():
            for node, gpus in by_node.items():
                self.on_node.setdefault(node, []).append((gpus, job_id))
        for held_there in self.on_node.values():
            held_there.sort(reverse=True)
        # the most any node could have free were every idle job on it gone: a job needing more is skipped at once
        self.most = max(
            (self._free_on(node) + sum(g for g, _ in there) for node, there in self.on_node.items()), default=0
        )

    def _free_on(self, node: int) -> int:
        return self.scheduler.state.free_count(node) + self.freed[node]

    def _ready(self, need: int) -> int:
        if need not in self.ready:
            nodes = range(len(self.scheduler.state.spec.nodes))
            self.ready[need] = sum(1 for node in nodes if self._free_on(node) >= need)
        return self.ready[need]

    def make_for(self, request: GangRequest, held: bool) -> list[str]:
        """Take the fewest idle jobs of the pool whose leaving lets `request` start and return them; none if they
        cannot make the room, or if it fits already and is queued (it waits for its turn, not for GPUs). Held
        back by quota and fitting, the first of them."""
        need, count = self.scheduler.span(request.shape)
        ready = self._ready(need)
        if ready >= count:
            return self._take([next(iter(self.pool))]) if held else []
        if need > self.most:
            return []
        options: list[tuple[int, list[str]]] = []  # (GPUs evicted, idle jobs) per node it would free
        for node, held_there in self.on_node.items():
            free = have = self._free_on(node)
            if have >= need:
                continue  # counted ready already
            taken: list[str] = []
            for gpus, job_id in held_there:
                taken.append(job_id)
                have += gpus
                if have >= need:
                    options.append((have - free, taken))
                    break
        if ready + len(options) < count:
            return []
        picked: list[str] = []
        for _, taken in sorted(options)[: count - ready]:
            picked += [job_id for job_id in taken if job_id not in picked]
        return self._take(picked)

    def _take(self, job_ids: list[str]) -> list[str]:
        for job_id in job_ids:
            self.freed += self.pool.pop(job_id)
        self._index()
        return job_ids


def parse_idle_reclaim(text: str) -> dict[str, IdlePolicy]:
    """`queue=never|after:SECONDS|waiting:SECONDS,...` (`*` for every other queue); ValueError names the entry."""
    policies: dict[str, IdlePolicy] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        queue, _, rule = entry.partition("=")
        mode, _, seconds = rule.partition(":")
        if not queue or mode not in IDLE_MODES:
            raise ValueError(f"{entry!r}: expected queue=never|after:SECONDS|waiting:SECONDS")
        if mode == "never":
            policies[queue] = IdlePolicy()
            continue
        try:
            idle_s = float(seconds)
        except ValueError:
            raise ValueError(f"{entry!r}: expected a number of seconds after {mode}:") from None
        if not idle_s >= 0:
            raise ValueError(f"{entry!r}: seconds must be >= 0")
        policies[queue] = IdlePolicy(mode, idle_s)
    return policies
