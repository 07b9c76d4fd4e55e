"""One replay session: the baseline and Kumiki phases on the live services, each checked, plus the same trace
simulated, written as results.json, report.md and report.png (`kumiki.replay.report`)."""

from __future__ import annotations

import asyncio
import csv
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kumiki.common.config import DatabaseSettings, KafkaSettings
from kumiki.data import bundled_trace, resolve_trace
from kumiki.devstack.queues import development_tree
from kumiki.placement.core import LIVE_POLICIES
from kumiki.quota.adapters.store import replace_tree
from kumiki.quota.core import QuotaConfig
from kumiki.replay.core import (
    DEFAULT_PHASES,
    PHASES,
    Outcome,
    ReplayError,
    ReplayJob,
    double_holds,
    plan_jobs,
    queue_tree,
    summarise,
)
from kumiki.replay.driver import LiveCounts, LogEntry, Replay, publish_cluster, restore_cluster
from kumiki.replay.kube import KubeReplay, create_nodes, delete_nodes
from kumiki.replay.nodes import NodeAgents
from kumiki.sched.idle import parse_idle_reclaim
from kumiki.sim.scenarios import IdleReclaim, ProgressReports
from kumiki.sim.trace import load_jobs

GPUS_PER_NODE = 8
# How placement runs in a phase, where it differs from the stack's own configuration (a restart applies it)
PHASE_OVERRIDES: dict[str, dict[str, str]] = {
    # today's cluster: FIFO, and a zombie keeps its GPUs (telemetry still finds it; nobody acts)
    "baseline": {"KUMIKI_PLACEMENT_POLICY": "fifo", "KUMIKI_PLACEMENT_IDLE_RECLAIM": ""},
    "open": {"KUMIKI_QUOTA_ADDRESS": ""},  # allow-all admission: nothing but placement decides
}
DEFAULT_TRACE = "philly-replay"
VIAS = ("auto", "bind", "pods")
IDLE_THRESHOLD_PCT = 5.0
SAMPLES_PER_IDLE_RULE = 4  # the nodes sample this many times within the idle rule's duration (at least)
MAX_SAMPLE_INTERVAL_S = 1.0


def idle_rules(idle_after_s: float, speed: float) -> str:
    """Telemetry's idle rule for a replay: `idle_after_s` trace seconds below the threshold, in wall seconds."""
    return f"default={IDLE_THRESHOLD_PCT:g}:{idle_after_s / speed:.6g}"


def sample_interval_s(idle_after_s: float, speed: float) -> float:
    """How often the emulated nodes sample (wall seconds): often enough that the rule's window holds samples."""
    return min(MAX_SAMPLE_INTERVAL_S, idle_after_s / speed / SAMPLES_PER_IDLE_RULE)


@dataclass
class ReplaySettings:
    trace: str = DEFAULT_TRACE
    nodes: int = 16
    speed: float = 1000.0
    phases: tuple[str, ...] = DEFAULT_PHASES
    idle_fraction: float = 0.1
    seed: int = 0
    out: Path = Path("out/replay")
    timeout_s: float = 900.0
    simulate: bool = True
    policy: str | None = None  # the kumiki phase's placement policy (None: the stack's own)
    idle_after_s: float = 600.0  # trace seconds a zombie's GPUs stay below 5% before telemetry reports them
    via: str = "auto"  # bind: Placement.Bind calls; pods: PodGroups and pods through the binder; auto: pods if up
    # a scenario the trace does not carry: which jobs report their progress (as the simulator's --progress-reports;
    # the same jobs report in the simulated counterpart). None: none does, as in the trace
    progress_reports: ProgressReports | None = None

    def validate(self) -> None:
        if not 1 <= self.nodes <= 10_000:
            raise ReplayError(f"--nodes: expected 1..10000, got {self.nodes}")
        if not 1.0 <= self.speed <= 100_000.0:
            raise ReplayError(f"--speed: expected 1..100000, got {self.speed:g}")
        unknown = [phase for phase in self.phases if phase not in PHASES]
        if unknown or not self.phases:
            raise ReplayError(
                f"--phases: expected some of {', '.join(PHASES)}, got {','.join(self.phases) or '(none)'}"
            )
        if self.policy is not None and self.policy not in LIVE_POLICIES:
            raise ReplayError(f"--policy: expected one of {', '.join(LIVE_POLICIES)}, got {self.policy!r}")
        try:
            resolve_trace(self.trace)
        except FileNotFoundError as error:
            raise ReplayError(f"--trace: {error}") from None
        if self.timeout_s <= 0:
            raise ReplayError(f"--timeout-s: must be > 0, got {self.timeout_s:g}")
        if not 0 < self.idle_after_s <= 7 * 86400:
            raise ReplayError(f"--idle-after-s: expected 0 < s <= 604800 (trace seconds), got {self.idle_after_s:g}")
        if self.via not in VIAS:
            raise ReplayError(f"--via: expected one of {', '.join(VIAS)}, got {self.via!r}")
        if self.idle_after_s / self.speed < 0.05:
            raise ReplayError(
                f"--idle-after-s: {self.idle_after_s:g} trace seconds at --speed {self.speed:g} is under 50 ms of"
                " wall time, shorter than telemetry's batches; raise it or lower the speed"
            )


@dataclass
class Endpoints:
    placement: str
    kafka: KafkaSettings
    database: DatabaseSettings
    # restart a local service with these environment overrides (a local stack); None: its settings cannot change.
    # It returns the addresses it moved (old -> new): a port taken before the service could listen moves it.
    restart: Callable[[str, dict[str, str]], Mapping[str, str]] | None = None
    # a local service's environment overrides of the moment (what `restart` last applied, or `up` set)
    service_env: Callable[[str], dict[str, str]] | None = None
    placement_policy: str = "fifo-backfill"
    placement_idle_reclaim: str = ""  # placement's KUMIKI_PLACEMENT_IDLE_RECLAIM, for the simulated twins
    placement_strategy: str = "kumiki"
    checkpoints: str | None = None  # the preemption service (Checkpoints), where the replay's jobs report
    kubeconfig: Path | None = None  # the stack's API server with the binder running (`kumiki up --kubernetes`)

    def moved(self, addresses: Mapping[str, str]) -> Endpoints:
        """The same endpoints after a restart that moved local services (old address -> new)."""
        checkpoints = self.checkpoints and addresses.get(self.checkpoints, self.checkpoints)
        return replace(self, placement=addresses.get(self.placement, self.placement), checkpoints=checkpoints)

    def via(self, wanted: str) -> str:
        """How jobs are submitted: `pods` needs the Kubernetes stack; `auto` takes it when it is up."""
        if wanted == "pods" and self.kubeconfig is None:
            raise ReplayError("--via pods: no Kubernetes stack with the binder runs here; `kumiki up --kubernetes`")
        if wanted == "auto":
            return "pods" if self.kubeconfig is not None else "bind"
        return wanted


@dataclass
class PhaseResult:
    phase: str
    policy: str
    summary: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    log: list[LogEntry] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    prefix: str = ""
    progress_reported: int = 0  # progress reports the phase's jobs sent (the --progress-reports scenario)


def vc_weights() -> dict[str, float]:
    """Philly VCs' node counts: the quota guarantees the replay's queue trees are drawn from."""
    with bundled_trace("philly-vc-nodes").open(newline="") as handle:
        return {row["vc"]: float(row["node num"]) for row in csv.DictReader(handle)}


def check_phase(jobs: Sequence[ReplayJob], outcomes: Sequence[Outcome], log: Sequence[LogEntry]) -> list[str]:
    """The invariants every phase must end with: each job completed exactly once, no GPU held twice."""
    problems = []
    if len(outcomes) != len(jobs):
        problems.append(f"{len(jobs) - len(outcomes)} of {len(jobs)} jobs did not complete")
    ends: dict[tuple[str, int], int] = {}
    for entry in log:
        if entry.kind == "ended":
            ends[(entry.job_id, entry.generation)] = ends.get((entry.job_id, entry.generation), 0) + 1
    twice = sorted(f"{job}/{generation}" for (job, generation), count in ends.items() if count > 1)
    if twice:
        problems.append(f"ended more than once: {', '.join(twice[:5])}")
    # events of different jobs sit on different partitions, so the log's read order is not their order: replay
    # them by their own time (placement stamps a release before the bind that reuses its GPUs), endings first
    ordered = sorted(log, key=lambda e: (e.at_us, e.kind != "ended"))
    problems.extend(double_holds((e.kind, e.job_id, e.generation, e.gpus) for e in ordered))
    return problems


def simulate_counterpart(
    jobs: Sequence[ReplayJob],
    nodes: int,
    policy: str,
    strategy: str,
    progress: ProgressReports | None = None,
    quota: QuotaConfig | None = None,
    idle: IdleReclaim | None = None,
) -> dict[str, Any]:
    """The same jobs, cluster, policy and queue tree in the simulator (None: no quota service, the open phase),
    the same jobs reporting their progress when the replay's did, and the same zombies, found and reclaimed by
    placement's rules (`idle`; None: never reclaimed)."""
    from kumiki.sched.cluster import uniform_cluster
    from kumiki.sched.policies import POLICIES
    from kumiki.sim.engine import SimConfig, SimJobSpec, Simulator

    specs = [SimJobSpec(job.job_id, job.submit_s, job.gpus, job.duration_s, job.queue, idle=job.idle) for job in jobs]
    spec = uniform_cluster(nodes, GPUS_PER_NODE, island_size=GPUS_PER_NODE)
    forecaster = None
    if POLICIES[policy].uses_forecast:  # a fresh one, learning online as the live forecast service does
        from kumiki.forecast.models import build_default_forecaster

        forecaster = build_default_forecaster()
    config = SimConfig(
        POLICIES[policy], placement=strategy, progress_reports=progress, quota=quota, idle=idle or IdleReclaim()
    )
    result = Simulator(spec, specs, config, forecaster=forecaster).run()
    jcts = [job.jct_s for job in result.jobs]
    return {
        "avg_jct_s": sum(jcts) / len(jcts),
        "avg_queue_s": sum(job.queue_s for job in result.jobs) / len(result.jobs),
        "idle_found": result.idle_found,
        "idle_reclaimed": result.idle_reclaimed,
        # None: never (the path's nodes send no GPU samples), which JSON has no number for
        "idle_found_after_s": None if math.isinf(config.idle.found_after_s) else config.idle.found_after_s,
    }


def _twin_idle(phase: str, settings: ReplaySettings, endpoints: Endpoints, found_after_s: float = 0.0) -> IdleReclaim:
    """Placement's idle rule in the phase (its override, else the stack's), for the twin, with telemetry's delay
    as the live phase measured it (`found_after_s`, the median; 0: none found, the rule's own duration; inf:
    never, as on the pods path, whose KWOK nodes send no GPU samples).

    The live delay is the rule's duration plus sampling, chunk batching and the broker: at 1000x their fraction of
    a wall second is hundreds of trace seconds, so a twin that found zombies at the rule's 600 s found them sooner
    than the live phase could and reclaimed half again as many. A bad rule is a ValueError, which the twin reports
    as its failure."""
    rules = PHASE_OVERRIDES.get(phase, {}).get("KUMIKI_PLACEMENT_IDLE_RECLAIM", endpoints.placement_idle_reclaim)
    policies = parse_idle_reclaim(rules)  # checked even when unused: a bad rule is the twin's reported failure
    if math.isinf(found_after_s):
        return IdleReclaim(math.inf, {})
    return IdleReclaim(max(settings.idle_after_s, found_after_s), policies)


async def _telemetry_for(settings: ReplaySettings, endpoints: Endpoints) -> Endpoints:
    """Telemetry's idle rule in the replay's time: restart the local telemetry service when it has another."""
    wanted = idle_rules(settings.idle_after_s, settings.speed)
    if endpoints.service_env is None or endpoints.restart is None:
        return endpoints  # not a local stack: its telemetry keeps its own rule (zombies are found at its pace)
    current = endpoints.service_env("telemetry-ingest")
    if current.get("KUMIKI_TELEMETRY_IDLE") == wanted:
        return endpoints
    overrides = {**current, "KUMIKI_TELEMETRY_IDLE": wanted}
    return endpoints.moved(await asyncio.to_thread(endpoints.restart, "telemetry-ingest", overrides))


async def run_session(
    settings: ReplaySettings,
    endpoints: Endpoints,
    *,
    counts: LiveCounts | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every phase in turn on the live stack; returns the results (also written under settings.out)."""
    settings.validate()
    trace = load_jobs(settings.trace)
    jobs = plan_jobs(
        trace,
        gpus_per_node=GPUS_PER_NODE,
        nodes=settings.nodes,
        idle_fraction=settings.idle_fraction,
        seed=settings.seed,
    )
    capacity = settings.nodes * GPUS_PER_NODE
    weights = vc_weights()
    trees = {phase: queue_tree(jobs, capacity, weights, static=phase == "baseline") for phase in settings.phases}
    via = endpoints.via(settings.via)
    endpoints = await _telemetry_for(settings, endpoints)
    if via == "pods":  # KWOK nodes in the API server; the binder publishes them on cluster.state
        assert endpoints.kubeconfig is not None
        await delete_nodes(endpoints.kubeconfig, keep=settings.nodes)
        await create_nodes(endpoints.kubeconfig, settings.nodes)
    # the emulated nodes of the Bind path (none through Kubernetes: there the binder's nodes are the cluster)
    cluster = await publish_cluster(endpoints.kafka, settings.nodes if via == "bind" else 0)
    agents = NodeAgents(
        endpoints.kafka,
        cluster.nodes,
        interval_s=sample_interval_s(settings.idle_after_s, settings.speed),
        seed=settings.seed,
    )
    previous_tree, _ = await replace_tree(endpoints.database, None, "replay")
    run_id = time.strftime("r%H%M%S")
    reporters = settings.progress_reports.reporters(jobs) if settings.progress_reports is not None else {}
    results: list[PhaseResult] = []
    try:
        await agents.start()
        for phase in settings.phases:
            baseline = phase == "baseline"
            await replace_tree(endpoints.database, trees[phase], f"replay {phase}")
            policy = endpoints.placement_policy
            overrides = dict(PHASE_OVERRIDES.get(phase, {}))
            if phase != "baseline" and settings.policy not in (None, endpoints.placement_policy):
                overrides["KUMIKI_PLACEMENT_POLICY"] = str(settings.policy)
            restart = endpoints.restart
            restarted = bool(overrides) and restart is not None
            if overrides and restart is None:
                raise ReplayError(f"--phases: {phase} restarts placement, which only a local stack (`kumiki up`) can")
            if restart is not None and restarted:
                endpoints = endpoints.moved(await asyncio.to_thread(restart, "placement", overrides))
                policy = overrides.get("KUMIKI_PLACEMENT_POLICY", policy)
            if on_phase is not None:
                on_phase(phase)
            live = counts if counts is not None else LiveCounts()
            options: dict[str, Any] = {
                "placement_address": endpoints.placement,
                "kafka": endpoints.kafka,
                "speed": settings.speed,
                "phase": phase,
                "preemptible": not baseline,
                "run_id": run_id,
                "counts": live,
                "checkpoints_address": endpoints.checkpoints,
                "agents": agents,
                "progress": reporters,
            }
            replay = (
                KubeReplay(jobs, kubeconfig=endpoints.kubeconfig, **options)
                if via == "pods" and endpoints.kubeconfig is not None
                else Replay(jobs, **options)
            )
            try:
                outcomes = await replay.run(timeout_s=settings.timeout_s)
            finally:
                if restart is not None and restarted:
                    endpoints = endpoints.moved(await asyncio.to_thread(restart, "placement", {}))
            summary = summarise(phase, outcomes, len(jobs), capacity)
            results.append(
                PhaseResult(
                    phase,
                    f"{policy}/{endpoints.placement_strategy}",
                    asdict(summary),
                    check_phase(jobs, outcomes, replay.log),
                    replay.errors,
                    replay.log,
                    outcomes,
                    replay.prefix,
                    replay.progress_reported,
                )
            )
    finally:
        # what was there before, else the local stack's development tree (research, product, batch)
        await replace_tree(endpoints.database, previous_tree or development_tree(capacity), "replay done")
        await agents.stop()
        await restore_cluster(endpoints.kafka, cluster)
        if via == "pods":
            assert endpoints.kubeconfig is not None
            await delete_nodes(endpoints.kubeconfig)
    simulated: dict[str, Any] = {}  # the open phase's counterpart (no quota), kept under its old name
    by_phase: dict[str, Any] = {}  # each phase's: its policy and queue tree
    if settings.simulate:
        policy = settings.policy or endpoints.placement_policy
        found_after = {result.phase: float(result.summary["idle_found_after_s"]) for result in results}
        if via == "pods":  # KWOK nodes send no GPU samples: telemetry finds no zombie there, nor may a twin
            found_after = dict.fromkeys([*settings.phases, "kumiki"], math.inf)
        for phase in settings.phases:
            phase_policy = "fifo" if phase == "baseline" else policy
            try:
                by_phase[phase] = simulate_counterpart(
                    jobs,
                    settings.nodes,
                    phase_policy,
                    endpoints.placement_strategy,
                    settings.progress_reports if phase != "baseline" else None,
                    None if phase == "open" else trees[phase],
                    _twin_idle(phase, settings, endpoints, found_after.get(phase, 0.0)),
                )
            except (ArithmeticError, ValueError) as error:  # the live run stands; the report says what failed
                by_phase[phase] = {"error": f"simulation failed: {error!r}"}
        if "open" in by_phase:
            simulated = by_phase["open"]
        elif "kumiki" in settings.phases:  # what the kumiki phase is also set against: the same run without quota
            try:
                simulated = simulate_counterpart(
                    jobs,
                    settings.nodes,
                    policy,
                    endpoints.placement_strategy,
                    settings.progress_reports,
                    idle=_twin_idle("open", settings, endpoints, found_after.get("kumiki", 0.0)),
                )
            except (ArithmeticError, ValueError) as error:
                simulated = {"error": f"simulation failed: {error!r}"}
    payload = {
        "trace": settings.trace,
        "jobs": len(jobs),
        "idle_jobs": sum(1 for job in jobs if job.idle),
        "idle_after_s": settings.idle_after_s,
        "samples_published": agents.samples_published,
        "via": via,
        "nodes": settings.nodes,
        "gpus_per_node": GPUS_PER_NODE,
        "speed": settings.speed,
        "seed": settings.seed,
        "progress_reports": None if settings.progress_reports is None else settings.progress_reports.describe(),
        "progress_reporters": sum(1 for job in jobs if job.job_id in reporters and not job.idle),  # zombies: none
        "phases": {
            result.phase: {
                "policy": result.policy,
                "summary": result.summary,
                "problems": result.problems,
                "errors": result.errors[:20],
                "prefix": result.prefix,
                "progress_reported": result.progress_reported,
            }
            for result in results
        },
        "simulated_kumiki": simulated,
        "simulated_phases": by_phase,
    }
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "results.json").write_text(json.dumps(payload, indent=2))
    with (settings.out / "jobs.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["phase", "job_id", "queue", "gpus", "submitted_s", "bound_s", "ended_s", "idle", "runs"])
        for result in results:
            for o in result.outcomes:
                writer.writerow(
                    [
                        result.phase,
                        o.job_id,
                        o.queue,
                        o.gpus,
                        f"{o.submitted_s:.1f}",
                        f"{o.bound_s:.1f}",
                        f"{o.ended_s:.1f}",
                        int(o.idle),
                        o.runs,
                    ]
                )
    payload["_results"] = results  # for callers in this process (tests read the logs); not written
    return payload
