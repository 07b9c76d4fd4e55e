"""Telemetry ingest's settings and their parsing from the environment: windows, timeouts, batching and the
idle rules per queue. Errors name the variable, so a bad deployment fails at start with the field to fix."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from kumiki.common.config import ConfigError, Environ, env_float, env_int, env_str


@dataclass(frozen=True, slots=True)
class IdleRule:
    """A job's GPUs are idle when every sample stays below `threshold_pct` for `duration_s`."""

    threshold_pct: float
    duration_s: float


@dataclass(frozen=True)
class TelemetryConfig:
    gpu_window_s: float = 60.0  # tumbling, per GPU and per node
    usage_window_s: float = 300.0  # hopping, per job and per queue ...
    usage_step_s: float = 60.0  # ... advancing by this step
    window_expires_s: float = 3600.0
    node_timeout_s: float = 30.0  # a node silent this long is unhealthy
    publish_interval_s: float = 10.0  # cluster.state at most this often per node unless placement-relevant
    session_timeout_s: float = 30.0  # how long the group waits for a crashed worker before rebalancing
    # Stage 1 fills a batch for this long (or up to batch_max records). Stage 2's cost is per node chunk, and
    # a chunk holds one node's samples of one batch: a longer window (or a backlog) makes chunks bigger.
    batch_window_s: float = 0.25
    batch_max: int = 50000
    idle_default: IdleRule = IdleRule(5.0, 600.0)
    idle_by_queue: Mapping[str, IdleRule] = field(default_factory=dict)

    def rule_for(self, queue: str) -> IdleRule:
        return self.idle_by_queue.get(queue, self.idle_default)

    @property
    def bucket_s(self) -> float:
        """Chunks never straddle a window edge: the bucket divides every window size and step."""
        return float(math.gcd(int(self.gpu_window_s), int(self.usage_window_s), int(self.usage_step_s)))

    @classmethod
    def from_env(cls, env: Environ) -> TelemetryConfig:
        def seconds(name: str, default: float) -> float:
            value = env_float(env, name, default, minimum=1, maximum=7 * 86400)
            if value != int(value):
                raise ConfigError(f"{name}: expected a whole number of seconds, got {value:g}")
            return value

        gpu_window = seconds("KUMIKI_TELEMETRY_GPU_WINDOW_S", cls.gpu_window_s)
        usage_window = seconds("KUMIKI_TELEMETRY_USAGE_WINDOW_S", cls.usage_window_s)
        usage_step = seconds("KUMIKI_TELEMETRY_USAGE_STEP_S", cls.usage_step_s)
        if usage_step > usage_window:
            raise ConfigError(
                f"KUMIKI_TELEMETRY_USAGE_STEP_S: expected <= KUMIKI_TELEMETRY_USAGE_WINDOW_S ({usage_window:g}),"
                f" got {usage_step:g}"
            )
        default, by_queue = parse_idle_rules(
            env_str(env, "KUMIKI_TELEMETRY_IDLE", "default=5:600"), "KUMIKI_TELEMETRY_IDLE"
        )
        return cls(
            gpu_window_s=gpu_window,
            usage_window_s=usage_window,
            usage_step_s=usage_step,
            window_expires_s=seconds("KUMIKI_TELEMETRY_WINDOW_EXPIRES_S", cls.window_expires_s),
            node_timeout_s=env_float(
                env, "KUMIKI_TELEMETRY_NODE_TIMEOUT_S", cls.node_timeout_s, minimum=0.1, maximum=86400
            ),
            publish_interval_s=env_float(
                env, "KUMIKI_TELEMETRY_PUBLISH_INTERVAL_S", cls.publish_interval_s, minimum=0, maximum=3600
            ),
            session_timeout_s=env_float(
                env, "KUMIKI_TELEMETRY_SESSION_TIMEOUT_S", cls.session_timeout_s, minimum=6, maximum=1800
            ),
            batch_window_s=env_float(
                env, "KUMIKI_TELEMETRY_BATCH_WINDOW_S", cls.batch_window_s, minimum=0.01, maximum=10
            ),
            batch_max=env_int(env, "KUMIKI_TELEMETRY_BATCH_MAX", cls.batch_max, minimum=100, maximum=500000),
            idle_default=default,
            idle_by_queue=by_queue,
        )


def parse_idle_rules(text: str, variable: str) -> tuple[IdleRule, dict[str, IdleRule]]:
    """'default=5:600,research=10:1800': queue=threshold_pct:duration_s; errors name the variable and entry."""
    default = TelemetryConfig.idle_default
    by_queue: dict[str, IdleRule] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        queue, sep, rule = entry.partition("=")
        threshold, colon, duration = rule.partition(":")
        if not sep or not colon or not queue.strip():
            raise ConfigError(f"{variable}: expected queue=threshold_pct:duration_s, got {entry!r}")
        try:
            parsed = IdleRule(float(threshold), float(duration))
        except ValueError:
            raise ConfigError(f"{variable}: {entry!r}: threshold and duration must be numbers") from None
        if not 0 < parsed.threshold_pct <= 100 or not math.isfinite(parsed.threshold_pct):
            raise ConfigError(f"{variable}: {entry!r}: threshold must be within (0, 100]")
        if not 0 < parsed.duration_s < math.inf:
            raise ConfigError(f"{variable}: {entry!r}: duration must be > 0 seconds")
        if queue.strip() == "default":
            default = parsed
        else:
            by_queue[queue.strip()] = parsed
    return default, by_queue
