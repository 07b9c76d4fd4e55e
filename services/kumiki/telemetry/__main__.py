import sys

from kumiki.common.service import run_service
from kumiki.telemetry.app import SPEC

sys.exit(run_service(SPEC))
