"""Live against simulated, over several windows of the Philly slice: the replay's `open` phase (the live
services with no quota admission) against `kumiki simulate`'s engine on the same jobs, cluster and policy.

    .venv/bin/python benchmarks/replay_agreement.py [--windows 36,96,144] [--speed 1000] [--load 1.25]

Each window is the jobs submitted in its 6 hours (hours since the slice's start) whose run time is at most
6 h, on as many 8-GPU nodes as give an offered load of --load over the window. A local stack (development
broker, embedded Postgres, the five services) is started in a temporary folder and stopped at the end. The
ratio printed is live / simulated average JCT; the simulated run, made in the same process, is the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from kumiki.devstack.processes import free_port
from kumiki.replay.runner import GPUS_PER_NODE, ReplaySettings, run_session
from kumiki.sim.trace import TRACE_COLUMNS, load_jobs

WINDOW_S = 6 * 3600.0


def cut_window(hour: int, folder: Path) -> tuple[Path, int, float]:
    """The window's jobs as a trace file; returns (path, jobs, GPU-hours)."""
    start = hour * 3600.0
    jobs = [
        job
        for job in load_jobs("philly-slice")
        if job.submit_s is not None
        and job.duration_s is not None
        and start <= job.submit_s < start + WINDOW_S
        and job.duration_s <= WINDOW_S
    ]
    path = folder / f"window-{hour}.csv"
    rows = [",".join(TRACE_COLUMNS)]
    for job in jobs:
        assert job.submit_s is not None and job.duration_s is not None
        rows.append(f"{job.job_id},{job.submit_s - start:g},{job.gpus:g},,,{job.duration_s:g},,{job.queue},,")
    path.write_text("\n".join(rows) + "\n")
    gpu_h = sum(job.gpus * (job.duration_s or 0.0) for job in jobs) / 3600.0
    largest = max(int(job.gpus) for job in jobs)
    return path, len(jobs), max(gpu_h, largest * WINDOW_S / 3600.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="36,96,144", help="window start hours, comma-separated")
    parser.add_argument("--speed", type=float, default=1000.0)
    parser.add_argument("--load", type=float, default=1.25, help="offered load the cluster size is chosen for")
    args = parser.parse_args()
    hours = [int(hour) for hour in args.windows.split(",") if hour.strip()]
    folder = Path(tempfile.mkdtemp(prefix="kumiki-agreement-"))
    env = {key: value for key, value in os.environ.items() if not key.startswith("KUMIKI_")}
    env["KUMIKI_HOME"] = str(folder / "stack")
    cli = [sys.executable, "-m", "kumiki.cli"]
    ports = ["--kafka-port", str(free_port()), "--postgres-port", str(free_port())]
    subprocess.run([*cli, "up", "--no-replay", "--emulate-nodes", "0", *ports], env=env, check=True)
    os.environ.update({"KUMIKI_HOME": env["KUMIKI_HOME"]})
    from kumiki.cli.replay import endpoints

    rows = []
    try:
        for hour in hours:
            trace, count, gpu_h = cut_window(hour, folder)
            nodes = max(1, math.ceil(gpu_h / (WINDOW_S / 3600.0) / GPUS_PER_NODE / args.load))
            settings = ReplaySettings(
                trace=str(trace), nodes=nodes, speed=args.speed, phases=("open",), out=folder / f"out-{hour}"
            )
            results = asyncio.run(run_session(settings, endpoints()))
            live = results["phases"]["open"]["summary"]["avg_jct_s"]
            simulated = results["simulated_kumiki"]["avg_jct_s"]
            problems = results["phases"]["open"]["problems"]
            rows.append((hour, count, nodes, live, simulated, problems))
            print(
                f"window {hour}h: {count} jobs on {nodes} x 8: live {live:,.0f} s, simulated {simulated:,.0f} s,"
                f" ratio {live / simulated:.3f}{'; ' + '; '.join(problems) if problems else ''}",
                flush=True,
            )
    finally:
        subprocess.run([*cli, "down"], env=env, check=False)
    print()
    print("| window (h) | jobs | nodes x 8 | live avg JCT (s) | simulated (s) | live / simulated |")
    print("|---|---|---|---|---|---|")
    for hour, count, nodes, live, simulated, _ in rows:
        print(f"| {hour}-{hour + 6} | {count} | {nodes} | {live:,.0f} | {simulated:,.0f} | {live / simulated:.3f} |")
    return 1 if any(problems for *_, problems in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
