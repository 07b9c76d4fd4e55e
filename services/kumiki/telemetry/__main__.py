import os
import sys

from kumiki.common.config import ConfigError
from kumiki.common.service import run_service
from kumiki.telemetry.adapters.agent_identity import AgentIdentity
from kumiki.telemetry.app import SPEC
from kumiki.telemetry.core import TelemetryConfig

try:  # the shell checks the shared variables; telemetry's own are checked here, before anything starts
    TelemetryConfig.from_env(os.environ)
    AgentIdentity.settings_from_env(os.environ)
except ConfigError as error:
    print(f"kumiki-{SPEC.name}: configuration error: {error}", file=sys.stderr)
    sys.exit(2)
sys.exit(run_service(SPEC))
