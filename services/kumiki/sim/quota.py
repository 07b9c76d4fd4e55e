"""Quota admission in the simulator: the quota service's own core over an in-memory book of holdings.

The live stack's rules, so that a simulated run and a live replay of the same queue tree can be compared:

- every attempt (an arrival, and each preempted job's next generation) is admitted before it may queue; a denied
  one is held out of the queue and asked again in admission rounds (placement's cycle), the starving first, then
  in the policy's order (`sched.policies.admission_rank`);
- an admission inside the guarantee while borrowers hold the GPUs names borrowed victims
  (`quota.core.choose_victims`), which are preempted for it (reason `quota-reclaim`), and it starts on their GPUs;
- an attempt's ending or preemption frees its admission, and the ledger's rules (`quota.core.Ledger`) meter its
  GPU-seconds.

Every job is preemptible (a trace says nothing else), so beyond its guarantee a job borrows idle GPUs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from kumiki.quota.core import (
    ANY_MODEL,
    EPSILON,
    AdmitRequest,
    Holding,
    Ledger,
    LifecycleState,
    Outcome,
    QuotaConfig,
    choose_victims,
    decide_admission,
    gpus_decimal,
    with_live_capacity,
)

MICROS = 1_000_000
Rank = tuple[float, ...]  # a held job's place in the admission round: lower is asked first


class QuotaTreeError(ValueError):
    """A queue tree the simulation cannot run with; the message names the job or queue."""


@dataclass(frozen=True, slots=True)
class Admitted:
    borrowed: bool
    victims: tuple[str, ...]  # borrowed jobs to preempt so that this one gets its guarantee


def cluster_tree(config: QuotaConfig, total_gpus: int) -> QuotaConfig:
    """The tree on the simulated cluster: its capacity is the cluster's when smaller (live capacity's rule)."""
    return with_live_capacity(config, {ANY_MODEL: float(total_gpus)})


def check_jobs(config: QuotaConfig, jobs: Iterable[tuple[str, str, int]]) -> None:
    """Every (job, queue, GPUs) must be admissible some day: a leaf queue, and within every limit on its path
    and the capacity. Otherwise it would be held for ever and the run would never end."""
    capacity = sum(config.capacity_gpus.values())
    for job_id, queue, gpus in jobs:
        if queue not in config.queues:
            raise QuotaTreeError(f"job {job_id}: queue {queue!r} is not in the queue tree")
        if not config.is_leaf(queue):
            raise QuotaTreeError(f"job {job_id}: queue {queue!r} has child queues; jobs go to leaves")
        if gpus > capacity + EPSILON:
            raise QuotaTreeError(f"job {job_id}: {gpus} GPUs, more than the tree's capacity of {capacity:g}")
        for ancestor in config.ancestors(queue):
            if ancestor.limit_gpus is not None and gpus > ancestor.limit_gpus + EPSILON:
                raise QuotaTreeError(
                    f"job {job_id}: {gpus} GPUs, above the limit of queue {ancestor.path} ({ancestor.limit_gpus:g})"
                )


class SimQuota:
    """Holdings, held jobs and the ledger of one simulated run."""

    def __init__(self, config: QuotaConfig) -> None:
        self.config = config
        self.holdings: dict[str, Holding] = {}
        self.held: dict[str, Rank] = {}  # job -> its place in the admission round, while quota holds it back
        # held jobs by (queue, GPUs), each a heap by rank (entries of jobs no longer held are skipped)
        self._classes: dict[tuple[str, int], list[tuple[Rank, str]]] = {}
        self.ledger = Ledger()
        self.denied: Counter[str] = Counter()  # denials by quota's code
        self.reclaims = 0  # victims named
        self._sequence = 0
        # GPUs held per (queue, borrowed): all admission needs (as the service sums its rows), kept as they change
        self._totals: dict[tuple[str, bool], float] = {}
        self._released = False  # an admission ended since held jobs were last asked
        # held job -> its (queue, GPUs, when it began to wait: its starvation clock)
        self._held_class: dict[str, tuple[str, int, float]] = {}
        self._by_wait: list[tuple[float, str]] = []  # held jobs by that clock, sorted: who starves first

    def ask(
        self, job_id: str, generation: int, queue: str, gpus: int, rank: Rank, waiting_since_s: float
    ) -> Admitted | None:
        """Quota's answer for one attempt; None: held (the caller asks again at each pass). `rank`: its place in
        the admission rounds while held (`sched.policies.admission_rank`); `waiting_since_s`: when the attempt
        began to wait (its arrival, or its previous attempt's eviction), which the starvation limit counts from."""
        self._drop(job_id)  # a job asks only while it holds nothing; kept exact if a caller asks twice
        totals = [Holding(queue, gpus, borrowed=borrowed) for (queue, borrowed), gpus in self._totals.items()]
        request = AdmitRequest(job_id, generation, queue, float(gpus), preemptible=True)
        admission = decide_admission(self.config, totals, request)
        if not admission.admitted:
            if job_id not in self.held:  # counted once per attempt, by the reason it was first held for
                self.denied[admission.code] += 1
            self.hold(job_id, queue, gpus, rank, waiting_since_s)
            return None
        if self.held.pop(job_id, None) is not None:
            *_, since = self._held_class.pop(job_id)
            del self._by_wait[bisect.bisect_left(self._by_wait, (since, job_id))]
        victims: list[Holding] = []
        if admission.shortfall_gpus > EPSILON:
            victims, _ = choose_victims(self.config, list(self.holdings.values()), admission.shortfall_gpus, queue)
            for victim in victims:
                self.holdings[victim.job_id] = replace(victim, reclaiming=True)
            self.reclaims += len(victims)
        self._sequence += 1
        borrowed = admission.outcome is Outcome.BORROWED
        self.holdings[job_id] = Holding(
            queue, float(gpus), borrowed=borrowed, job_id=job_id, generation=generation, seq=self._sequence,
            running=False,
        )  # fmt: skip
        key = (queue, borrowed)
        self._totals[key] = self._totals.get(key, 0.0) + gpus
        return Admitted(borrowed, tuple(victim.job_id for victim in victims))

    def hold(self, job_id: str, queue: str, gpus: int, rank: Rank, waiting_since_s: float) -> None:
        """Out of the queue until quota admits it: denied, preempted (its next generation), or a reclaim victim
        that was admitted but had not started. Whatever it held is given up."""
        self._drop(job_id)
        if job_id not in self.held:
            self.held[job_id] = rank
            self._held_class[job_id] = (queue, gpus, waiting_since_s)
            bisect.insort(self._by_wait, (waiting_since_s, job_id))
            heapq.heappush(self._classes.setdefault((queue, gpus), []), (rank, job_id))

    def _drop(self, job_id: str) -> None:
        holding = self.holdings.pop(job_id, None)
        if holding is not None:
            key = (holding.queue, holding.borrowed)
            self._totals[key] -= holding.gpus
            if self._totals[key] <= EPSILON:
                del self._totals[key]
            self._released = True

    def ask_held(self, enter: Callable[[str], bool], starving_before: float = -math.inf) -> None:
        """One admission round over the held jobs (placement's cycle): those waiting since at or before
        `starving_before` first, longest waiting first, then the rest by rank. `enter` asks quota for one (and
        queues it) and says whether it was admitted. A release during the round (a reclaim victim that had not
        started) starts it over, as placement's next cycle would.

        Only a release can turn a denial into an admission, so there is no round without one since the last.
        Within a round use only grows, and a denial of g GPUs in a queue holds for every request of g or more in
        it: the rest of that queue's jobs of that size or larger are not asked. The answers are those of asking
        every held job, without thousands of asks at every event."""
        while self._released:
            self._released = False
            closed: dict[str, int] = {}  # queue -> the fewest GPUs it was denied this round
            for since, job_id in list(self._by_wait):  # a copy: admissions leave it
                if since > starving_before or self._released:
                    break
                if job_id in self.held:
                    self._ask_again(job_id, enter, closed)
            heads = [head for key in list(self._classes) if (head := self._head(key)) is not None]
            heapq.heapify(heads)
            while heads and not self._released:
                _, job_id, key = heapq.heappop(heads)
                if job_id in self.held and not self._ask_again(job_id, enter, closed):
                    continue  # its class is closed for the round: its head is not put back
                following = self._head(key)
                if following is not None:
                    heapq.heappush(heads, following)

    def _ask_again(self, job_id: str, enter: Callable[[str], bool], closed: dict[str, int]) -> bool:
        """One held job asked in a round, unless a denial this round already answers for it."""
        queue, gpus, _ = self._held_class[job_id]
        if gpus >= closed.get(queue, gpus + 1):
            return False
        if enter(job_id):
            return True
        closed[queue] = gpus
        return False

    def _head(self, key: tuple[str, int]) -> tuple[Rank, str, tuple[str, int]] | None:
        """The oldest job still held in one class, or None (emptied classes are dropped)."""
        heap = self._classes.get(key, [])  # a round nested in this one (reclaim's victims) may have emptied it
        while heap and self.held.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        if not heap:
            self._classes.pop(key, None)
            return None
        return heap[0][0], heap[0][1], key

    def started(self, job_id: str, generation: int, now_s: float) -> None:
        """Bound: the admission now holds GPUs (a victim frees them at once) and the meter opens."""
        holding = self.holdings[job_id]
        self.holdings[job_id] = replace(holding, running=True, generation=generation)
        self.ledger.apply(
            job_id=job_id,
            generation=generation,
            state=LifecycleState.BOUND,
            at_us=round(now_s * MICROS),
            queue=holding.queue,
            gpus=gpus_decimal(holding.gpus),
        )

    def ended(self, job_id: str, generation: int, now_s: float, state: LifecycleState) -> None:
        """Completed or preempted: the admission is over and the interval closes into the ledger."""
        self._drop(job_id)
        self.ledger.apply(job_id=job_id, generation=generation, state=state, at_us=round(now_s * MICROS))

    def summary(self) -> dict[str, Any]:
        by_queue: dict[str, Decimal] = {}
        for entry in self.ledger.closed.values():
            by_queue[entry.queue] = by_queue.get(entry.queue, Decimal(0)) + entry.gpu_seconds
        return {
            "denied": dict(sorted(self.denied.items())),
            "reclaims": self.reclaims,
            "gpu_s_by_queue": {queue: float(gpu_s) for queue, gpu_s in sorted(by_queue.items())},
        }
