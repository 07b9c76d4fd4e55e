"""kumiki.telemetry.core.config: the settings from the environment; errors name the variable."""

from __future__ import annotations

import pytest

from kumiki.common.config import ConfigError
from kumiki.telemetry.core import IdleRule, TelemetryConfig


def test_config_from_env_and_errors_name_the_variable() -> None:
    config = TelemetryConfig.from_env(
        {"KUMIKI_TELEMETRY_IDLE": "default=3:120, research=10:1800", "KUMIKI_TELEMETRY_USAGE_WINDOW_S": "600"}
    )
    assert config.idle_default == IdleRule(3.0, 120.0)
    assert config.rule_for("research") == IdleRule(10.0, 1800.0)
    assert config.rule_for("other") == IdleRule(3.0, 120.0)
    assert config.bucket_s == 60.0
    for env, name in [
        ({"KUMIKI_TELEMETRY_IDLE": "research=abc:5"}, "KUMIKI_TELEMETRY_IDLE"),
        ({"KUMIKI_TELEMETRY_IDLE": "research=150:5"}, "KUMIKI_TELEMETRY_IDLE"),
        ({"KUMIKI_TELEMETRY_IDLE": "research"}, "KUMIKI_TELEMETRY_IDLE"),
        ({"KUMIKI_TELEMETRY_USAGE_STEP_S": "900"}, "KUMIKI_TELEMETRY_USAGE_STEP_S"),
        ({"KUMIKI_TELEMETRY_GPU_WINDOW_S": "1.5"}, "KUMIKI_TELEMETRY_GPU_WINDOW_S"),
        ({"KUMIKI_TELEMETRY_NODE_TIMEOUT_S": "-1"}, "KUMIKI_TELEMETRY_NODE_TIMEOUT_S"),
        ({"KUMIKI_TELEMETRY_BATCH_WINDOW_S": "0"}, "KUMIKI_TELEMETRY_BATCH_WINDOW_S"),
        ({"KUMIKI_TELEMETRY_BATCH_MAX": "many"}, "KUMIKI_TELEMETRY_BATCH_MAX"),
    ]:
        with pytest.raises(ConfigError, match=f"^{name}: "):
            TelemetryConfig.from_env(env)
