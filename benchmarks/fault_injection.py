"""The fault-injection run on a private stack (kumiki.replay.faults): every service SIGKILLed and restarted in
turn, Apache Kafka and Postgres killed and restarted, one service paused past its session timeout, bad records
injected; then the exact checks. Exit status 0 only when every invariant held.

    .venv/bin/python benchmarks/fault_injection.py --jobs 10000 --nodes 96 --speed 1000
"""

from __future__ import annotations

import sys

from kumiki.replay.faults import main

if __name__ == "__main__":
    sys.exit(main())
