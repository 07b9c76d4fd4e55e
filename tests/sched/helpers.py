"""What the scheduling core's tests share: a job as the queue policy sees it, and two nodes with a job each."""

from __future__ import annotations

from kumiki.sched.cluster import ClusterState, uniform_cluster
from kumiki.sched.forecasting import JobFeatures
from kumiki.sched.jobs import JobView, consolidated_gang
from kumiki.sched.policies import POLICIES
from kumiki.sched.scheduler import Scheduler


def view(job_id: str, gpus: int, *, priority: int = 0, preemptible: bool = True, queue: str = "q") -> JobView:
    features = JobFeatures(job_id, queue, "", float(gpus), "", 0.0)
    return JobView(features, gpus, queue, 0.0, priority=priority, preemptible=preemptible)


def running_two(
    acknowledged: dict[str, float], *, min_run_s: float = 600.0, a: dict[str, object] | None = None, **second: object
) -> Scheduler:
    """`a` on node 0 and `b` on node 1 (4 of 4 GPUs each), both started at t=0 under the `kumiki` policy."""
    scheduler = Scheduler(
        POLICIES["kumiki"],
        ClusterState.empty(uniform_cluster(2, 4)),
        "best-fit",
        min_run_s=min_run_s,
        acknowledged=acknowledged,
    )
    scheduler.submit(view("a", 4, **(a or {})), consolidated_gang("a", 4, 4))  # type: ignore[arg-type]
    scheduler.submit(view("b", 4, **second), consolidated_gang("b", 4, 4))  # type: ignore[arg-type]
    assert sorted(start.job_id for start in scheduler.schedule(0.0).starts) == ["a", "b"]
    return scheduler
