"""The job side of preemption: three calls in a training loop, and a periodic checkpoint.

```python
from kumiki.sdk import Job

job = Job.from_env()                      # KUMIKI_JOB_ID, KUMIKI_JOB_GENERATION, KUMIKI_CHECKPOINTS_ADDRESS
point = job.resume_point()                # None: start from scratch
state = load(point.uri) if point else fresh()
while state.step < total:
    train_one_step(state)
    if job.should_checkpoint():           # asked to (preemption), or the periodic interval is up
        job.report_checkpoint(save(state), state.step, total_steps=total)
        if job.should_stop():             # it answered a preemption: exit now, the job resumes elsewhere
            sys.exit(0)
job.close()
```

A background thread holds `Checkpoints.Watch` open for this attempt (reconnecting with backoff when the
coordinator restarts) and records the commands: CHECKPOINT makes `should_checkpoint()` true; EVICT makes
`should_stop()` true. Jobs without the SDK get the Kubernetes convention instead (SIGTERM and the pod's grace
period, through the binder's eviction); `Job(handle_sigterm=True)` turns a SIGTERM into a checkpoint request.

The Report that answers a CHECKPOINT continues the command's trace (its `traceparent`): a
`kumiki.v1.Checkpoints/Report` CLIENT span when the job's process has an OpenTelemetry tracer provider, and the
context in the call's metadata either way, so the preemption is one trace in Jaeger.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

import grpc
from opentelemetry import propagate, trace

from kumiki.common.contracts.v1 import checkpoints_pb2, checkpoints_pb2_grpc, common_pb2, events_pb2
from kumiki.common.token_file import TokenFile

log = logging.getLogger(__name__)
tracer = trace.get_tracer("kumiki.sdk")

DEFAULT_INTERVAL_S = 1800.0
_T = TypeVar("_T")


class SdkConfigError(ValueError):
    """A missing or malformed setting; the message names the environment variable."""


@dataclass(frozen=True, slots=True)
class ResumePoint:
    uri: str
    step: int
    generation: int  # the attempt that wrote it


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SdkConfigError(f"{name}: expected a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise SdkConfigError(f"{name}: must be > 0, got {raw!r}")
    return value


def _token(env: Mapping[str, str]) -> str | TokenFile:
    token = env.get("KUMIKI_JOB_TOKEN", "").strip()
    path = env.get("KUMIKI_JOB_TOKEN_FILE", "")
    if token and path:
        raise SdkConfigError("KUMIKI_JOB_TOKEN_FILE: set KUMIKI_JOB_TOKEN or KUMIKI_JOB_TOKEN_FILE, not both")
    return TokenFile(Path(path), "KUMIKI_JOB_TOKEN_FILE", SdkConfigError) if path else token


class Job:
    """One running attempt of a job, as its training loop sees preemption."""

    def __init__(
        self,
        job_id: str,
        generation: int,
        address: str | None,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        handle_sigterm: bool = False,
        resume_uri: str = "",
        resume_step: int = 0,
        clock: Callable[[], float] = time.time,
        token: str | TokenFile = "",
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        if not job_id:
            raise SdkConfigError("KUMIKI_JOB_ID: required")
        if generation < 1:
            raise SdkConfigError(f"KUMIKI_JOB_GENERATION: must be >= 1, got {generation}")
        self.job_id = job_id
        self.generation = generation
        self.address = address
        self.interval_s = interval_s
        self.clock = clock
        self._resume = ResumePoint(resume_uri, resume_step, generation - 1) if resume_uri else None
        self._lock = threading.Lock()
        self._checkpoint_command: events_pb2.PreemptionCommand | None = None
        self._answered = False
        self._evicted: events_pb2.PreemptionCommand | None = None
        self._last_checkpoint_s = clock()
        self._stopping = threading.Event()
        # the job's own identity to the Checkpoints service: its token, or the certificate in `credentials`
        self._token = token
        if not address:
            self._channel: grpc.Channel | None = None
        elif credentials is not None:
            self._channel = grpc.secure_channel(address, credentials)
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = checkpoints_pb2_grpc.CheckpointsStub(self._channel) if self._channel else None
        self._watcher: threading.Thread | None = None
        self.commands: list[events_pb2.PreemptionCommand] = []  # every command seen, in order
        if self._stub is not None:
            self._watcher = threading.Thread(target=self._watch, name="kumiki-checkpoint-watch", daemon=True)
            self._watcher.start()
        if handle_sigterm:
            signal.signal(signal.SIGTERM, self._on_sigterm)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **options: object) -> Job:
        """From KUMIKI_JOB_ID, KUMIKI_JOB_GENERATION (default 1), KUMIKI_CHECKPOINTS_ADDRESS (unset: no
        coordinator, periodic checkpoints only), KUMIKI_CHECKPOINT_INTERVAL_S (default 1800), the binder's
        fallback KUMIKI_RESUME_URI / KUMIKI_RESUME_STEP, the job's identity (KUMIKI_JOB_TOKEN or
        KUMIKI_JOB_TOKEN_FILE, sent as a bearer token) and TLS as every Kumiki client has it (KUMIKI_GRPC_CAFILE,
        and KUMIKI_GRPC_CERTFILE / KUMIKI_GRPC_KEYFILE for a certificate named job:<id>)."""
        from kumiki.common.config import ConfigError
        from kumiki.common.grpcutil import client_credentials

        env = os.environ if env is None else env
        try:
            credentials = client_credentials(env)
        except ConfigError as error:
            raise SdkConfigError(str(error)) from None
        raw_generation = env.get("KUMIKI_JOB_GENERATION", "1") or "1"
        try:
            generation = int(raw_generation)
        except ValueError:
            raise SdkConfigError(f"KUMIKI_JOB_GENERATION: expected an integer, got {raw_generation!r}") from None
        raw_step = env.get("KUMIKI_RESUME_STEP", "0") or "0"
        if not raw_step.isdigit():
            raise SdkConfigError(f"KUMIKI_RESUME_STEP: expected a non-negative integer, got {raw_step!r}")
        return cls(
            env.get("KUMIKI_JOB_ID", ""),
            generation,
            env.get("KUMIKI_CHECKPOINTS_ADDRESS") or None,
            interval_s=_env_float(env, "KUMIKI_CHECKPOINT_INTERVAL_S", DEFAULT_INTERVAL_S),
            resume_uri=env.get("KUMIKI_RESUME_URI", ""),
            resume_step=int(raw_step),
            token=_token(env),
            credentials=credentials,
            **options,  # type: ignore[arg-type]
        )

    @property
    def _metadata(self) -> tuple[tuple[str, str], ...]:
        token = self._token.refresh() if isinstance(self._token, TokenFile) else self._token
        return (("authorization", f"Bearer {token}"),) if token else ()

    # ---- the three calls ---------------------------------------------------------------------------------
    def should_checkpoint(self) -> bool:
        """True when the coordinator asked for a checkpoint (not answered yet) or the periodic interval is up."""
        with self._lock:
            if self._checkpoint_command is not None and not self._answered:
                return True
        return self.periodic_due()

    def periodic_due(self) -> bool:
        """Only the periodic part of `should_checkpoint`."""
        return self.clock() - self._last_checkpoint_s >= self.interval_s

    def report_checkpoint(self, uri: str, step: int, *, duration_s: float = 0.0, total_steps: int = 0) -> bool:
        """Tell the coordinator a checkpoint is complete (written and durable); True when it was recorded.

        `total_steps`, the step the job ends at when it knows (0: unknown), tells how far it has got: the
        scheduler then forecasts its run time from its progress instead of from its submit-time features.
        When it answers a CHECKPOINT command, `should_stop()` becomes true: the job should exit now."""
        if not uri:
            raise ValueError("uri: required")
        for name, value in (("step", step), ("total_steps", total_steps)):
            if value < 0:
                raise ValueError(f"{name}: must be >= 0, got {value}")
        now = self.clock()
        with self._lock:
            command = self._checkpoint_command if not self._answered else None
        recorded = True
        if self._stub is not None:
            report = checkpoints_pb2.CheckpointReport(
                job=common_pb2.JobRef(job_id=self.job_id, generation=self.generation),
                uri=uri,
                step=step,
                total_steps=total_steps,
                command_id=command.command_id if command is not None else "",
                duration_s=duration_s,
            )
            report.completed_at.FromNanoseconds(int(now * 1e9))
            ack = self._traced_report(report, command.traceparent if command is not None else "")
            recorded = bool(ack.recorded)
        self._last_checkpoint_s = now
        if command is not None:
            with self._lock:
                self._answered = True
        return recorded

    def resume_point(self) -> ResumePoint | None:
        """Where this attempt resumes from: the binder's KUMIKI_RESUME_URI, else the coordinator's newest
        acknowledged checkpoint of the job; None for a fresh start."""
        if self._resume is not None:
            return self._resume
        if self._stub is None:
            return None
        request = checkpoints_pb2.ResumePointRequest(
            job=common_pb2.JobRef(job_id=self.job_id, generation=self.generation)
        )
        answer = self._call(lambda stub: stub.ResumePoint(request, timeout=10.0, metadata=self._metadata))
        if not answer.found:
            return None
        return ResumePoint(answer.uri, answer.step, answer.generation)

    def should_stop(self) -> bool:
        """True once the job answered a preemption's CHECKPOINT or was told to EVICT: exit, it resumes later."""
        with self._lock:
            return self._answered or self._evicted is not None

    @property
    def preempting(self) -> bool:
        """A preemption is under way for this attempt (CHECKPOINT or EVICT received)."""
        with self._lock:
            return self._checkpoint_command is not None or self._evicted is not None

    def close(self) -> None:
        self._stopping.set()
        if self._channel is not None:
            self._channel.close()

    # ---- plumbing ----------------------------------------------------------------------------------------
    def _traced_report(
        self, report: checkpoints_pb2.CheckpointReport, traceparent: str
    ) -> checkpoints_pb2.CheckpointAck:
        """Report as a CLIENT span (RPC semantic conventions), a child of the command's step when it answers one."""
        from kumiki.common.tracing import context_from_traceparent

        parent = context_from_traceparent(traceparent) if traceparent else None
        host, _, port = (self.address or "").rpartition(":")
        attributes: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": "kumiki.v1.Checkpoints",
            "rpc.method": "Report",
            "server.address": host,
            "kumiki.job.id": self.job_id,
            "kumiki.job.generation": self.generation,
        }
        if port.isdigit():
            attributes["server.port"] = int(port)
        with tracer.start_as_current_span(
            "kumiki.v1.Checkpoints/Report", context=parent, kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
            context = tuple((key, value) for key, value in carrier.items() if key in ("traceparent", "tracestate"))
            metadata = self._metadata + context
            try:
                ack: checkpoints_pb2.CheckpointAck = self._call(
                    lambda stub: stub.Report(report, timeout=10.0, metadata=metadata)
                )
            except grpc.RpcError as error:
                span.set_attribute("rpc.grpc.status_code", error.code().value[0])
                raise
            span.set_attribute("rpc.grpc.status_code", 0)
            return ack

    def _call(self, call: Callable[[checkpoints_pb2_grpc.CheckpointsStub], _T], attempts: int = 20) -> _T:
        """A unary call, retried while the coordinator is unavailable (it may be restarting)."""
        assert self._stub is not None
        for attempt in range(attempts):
            try:
                return call(self._stub)
            except grpc.RpcError as error:
                if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise
                if attempt == attempts - 1:
                    raise
                time.sleep(min(0.1 * 2**attempt, 2.0))
        raise AssertionError("unreachable")

    def _on_command(self, command: events_pb2.PreemptionCommand) -> None:
        with self._lock:
            self.commands.append(command)
            if command.action == events_pb2.PREEMPTION_ACTION_CHECKPOINT and self._checkpoint_command is None:
                self._checkpoint_command = command
            elif command.action == events_pb2.PREEMPTION_ACTION_EVICT:
                self._evicted = command

    def _watch(self) -> None:
        assert self._stub is not None
        request = checkpoints_pb2.WatchRequest(job=common_pb2.JobRef(job_id=self.job_id, generation=self.generation))
        backoff = 0.1
        while not self._stopping.is_set():
            try:
                for command in self._stub.Watch(request, metadata=self._metadata):
                    self._on_command(command)
                    backoff = 0.1
                    if command.action == events_pb2.PREEMPTION_ACTION_EVICT:
                        return
            except grpc.RpcError as error:
                if self._stopping.is_set():
                    return
                code = error.code()
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                    log.warning("checkpoint watch ended", extra={"code": str(code)})
                    return
            except ValueError:  # the channel was closed under us
                return
            self._stopping.wait(backoff)
            backoff = min(backoff * 2, 2.0)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """The Kubernetes fallback: SIGTERM (eviction with a grace period) asks for a checkpoint."""
        self._on_command(
            events_pb2.PreemptionCommand(
                command_id=f"{self.job_id}/{self.generation}/sigterm",
                job=common_pb2.JobRef(job_id=self.job_id, generation=self.generation),
                action=events_pb2.PREEMPTION_ACTION_CHECKPOINT,
                reason="sigterm",
            )
        )
