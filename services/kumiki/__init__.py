"""Kumiki: a GPU scheduler for Kubernetes that forecasts, packs, preempts with checkpoints and accounts."""

__version__ = "0.1.0"
