import sys

from kumiki.binder.app import SPEC
from kumiki.common.service import run_service

sys.exit(run_service(SPEC))
