import sys

from kumiki.common.service import run_service
from kumiki.forecast.app import SPEC

sys.exit(run_service(SPEC))
