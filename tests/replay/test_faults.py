"""The fault-injection run, short (4-7 minutes on two cores): 120 Philly jobs through a private stack
(Apache Kafka, Postgres, the five services) while each service is SIGKILLed and restarted, Kafka and Postgres
are killed and restarted, quota is paused past its session timeout, and 30 bad records are injected. The run's
own checks are exact (see kumiki.replay.faults); this test requires every one to hold and every fault to be
recovered from. The long run (10,000 jobs) is `benchmarks/fault_injection.py`, in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kumiki.devstack.broker import kafka_cache_dir
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(1200)]
# the broker first: a fault after the last job ended would find no bind to measure, and the driver reading
# job.lifecycle at its end needs the broker up
FAULTS = (
    "kafka",
    "kill:placement",
    "kill:quota",
    "kill:forecast",
    "kill:preemption",
    "kill:telemetry-ingest",
    "postgres",
    "pause:quota",
)


def test_every_invariant_holds_through_every_fault(tmp_path: Path) -> None:
    if shutil.which("java") is None and not (kafka_cache_dir() / "lib").exists():
        pytest.skip("the fault run restarts Apache Kafka: needs java and the Kafka jars (infra/ci/test.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUMIKI_")}
    out = tmp_path / "out"
    script = str(REPO_ROOT / "benchmarks" / "fault_injection.py")
    command = [sys.executable, script, "--jobs", "120", "--nodes", "16", "--speed", "100",
               "--max-duration-s", "7200", "--faults", ",".join(FAULTS), "--out", str(out)]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=1100, env=env, cwd=tmp_path)
    tail = run.stdout[-6000:] + run.stderr[-1500:] + _service_warnings(out / "logs")
    results = json.loads((out / "results.json").read_text())
    assert results["invariants"] and all(results["invariants"].values()), tail
    assert results["problems"] == [] and results["ledger_mismatches"] == [], tail
    assert run.returncode == 0, tail
    assert [fault["fault"] for fault in results["faults"]] == list(FAULTS)
    for fault in results["faults"]:
        assert fault["ready_s"] is not None, f"{fault['fault']} not recovered: {fault['note']}"
    assert results["completed"] == results["jobs"] == 120
    assert results["bad_records_injected"] == 30 and results["dead_lettered"] >= 30


def _service_warnings(logs: Path) -> str:
    """The services' warnings about offsets and handlers, which a failed ledger or lifecycle check is read with
    (the logs themselves live in the test's temporary directory only)."""
    wanted = ("going back", "handler failed", "offset commit failed", "background task failed", "Traceback")
    wanted += ("commit stalled", "failed on partition assignment", "could not read the stored offsets")
    lines = [
        f"{path.name}: {line}"
        for path in sorted(logs.glob("*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if any(word in line for word in wanted)
    ]
    return "\n--- service warnings ---\n" + "\n".join(lines[-40:]) if lines else ""
