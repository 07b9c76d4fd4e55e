"""python -m kumiki.quota: refuses to start (exit 2, one line) without caller authentication configured."""

import os
import sys

from kumiki.common.config import ConfigError
from kumiki.common.service import run_service
from kumiki.quota.adapters.auth import QuotaSettings
from kumiki.quota.app import SPEC

try:
    QuotaSettings.from_env(os.environ)
except ConfigError as error:
    print(f"kumiki-quota: configuration error: {error}", file=sys.stderr)
    sys.exit(2)
sys.exit(run_service(SPEC))
