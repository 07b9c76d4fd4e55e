"""A deterministic training loop through the SDK (numpy): least squares by minibatch SGD with fixed seeds.

`python -m kumiki.sdk.example --steps 400 --out weights.npy --checkpoints DIR` trains, checkpointing when the
coordinator asks (or every KUMIKI_CHECKPOINT_INTERVAL_S) and resuming from `resume_point()`. A checkpoint
holds the weights, the step and the minibatch generator's state, so an interrupted run that resumes ends with
the same bytes as one that never stopped. `--progress FILE` appends "step unix_time" after every step (what
tests measure lost work against); `--ignore-commands` plays a job that never answers a preemption (it stops
checkpointing when asked and keeps training until it is killed); `--max-checkpoints N` one whose checkpoints
stop after N.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

from kumiki.sdk import Job, atomic_write, path_of, uri_of

EXIT_PREEMPTED = 0  # a checkpointed, preempted job exits cleanly: it resumes as the next generation


def problem(seed: int, rows: int = 512, dim: int = 16) -> tuple[np.ndarray, np.ndarray]:
    data = np.random.default_rng(seed)
    features = data.standard_normal((rows, dim))
    truth = data.standard_normal(dim)
    return features, features @ truth + 0.01 * data.standard_normal(rows)


def save(directory: Path, step: int, weights: np.ndarray, rng: np.random.Generator) -> str:
    def write(file: BinaryIO) -> None:
        np.savez(file, weights=weights, step=np.int64(step), rng=np.array(json.dumps(rng.bit_generator.state)))

    return uri_of(atomic_write(directory / f"step-{step:08d}.npz", write))


def load(uri: str) -> tuple[int, np.ndarray, dict[str, object]]:
    with np.load(path_of(uri)) as saved:
        return int(saved["step"]), saved["weights"].copy(), json.loads(str(saved["rng"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kumiki.sdk.example")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-s", type=float, default=0.01, help="sleep per step (simulated compute)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, required=True)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--ignore-commands", action="store_true")
    parser.add_argument("--max-checkpoints", type=int, default=0, help="stop checkpointing after this many (0: never)")
    parser.add_argument("--save-s", type=float, default=0.0, help="extra seconds each checkpoint takes to write")
    parser.add_argument("--no-sdk", action="store_true", help="train without any coordinator (the reference run)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.step_s < 0:
        parser.error("--steps and --batch must be >= 1, --step-s >= 0")

    features, targets = problem(args.seed)
    weights = np.zeros(features.shape[1])
    rng = np.random.default_rng(args.seed + 1)
    step = 0
    job = None if args.no_sdk else Job.from_env()
    point = job.resume_point() if job is not None else None
    if point is not None:
        step, weights, state = load(point.uri)
        rng.bit_generator.state = state
    progress = args.progress.open("a") if args.progress else None
    written = 0
    while step < args.steps:
        batch = rng.integers(0, features.shape[0], size=args.batch)
        residual = features[batch] @ weights - targets[batch]
        weights = weights - args.lr * (features[batch].T @ residual) / args.batch
        step += 1
        time.sleep(args.step_s)
        if progress is not None:
            progress.write(f"{step} {time.time():.6f}\n")
            progress.flush()
        if job is None or step == args.steps:
            continue
        if args.max_checkpoints and written >= args.max_checkpoints:
            continue
        if args.ignore_commands:
            if job.periodic_due() and not job.preempting:
                job.report_checkpoint(save(args.checkpoints, step, weights, rng), step, total_steps=args.steps)
                written += 1
            continue
        if job.should_checkpoint():
            if progress is not None and job.preempting:
                progress.write(f"# answering {step}\n")  # a test waits for this to act mid-checkpoint
                progress.flush()
            time.sleep(args.save_s)
            job.report_checkpoint(save(args.checkpoints, step, weights, rng), step, total_steps=args.steps)
            written += 1
        if job.should_stop():
            job.close()
            return EXIT_PREEMPTED
    atomic_write(args.out, lambda file: np.save(file, weights))
    if job is not None:
        job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
