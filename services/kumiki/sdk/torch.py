"""PyTorch helper (optional extra `kumiki[torch]`): model, optimizer, RNG states and step, saved atomically."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kumiki.sdk.storage import atomic_write, path_of, uri_of


def save_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> str:
    """Write everything a bitwise-identical resume needs; returns the file:// URI to report."""
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy_rng": np.random.get_state(),
        "python_rng": random.getstate(),
    }
    target = atomic_write(path, lambda file: torch.save(state, file))
    return uri_of(target)


def load_state(uri: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore what `save_state` wrote (model, optimizer, every RNG); returns the step."""
    state = torch.load(path_of(uri), weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])
