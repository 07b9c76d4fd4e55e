"""Adapters of the preemption service: gRPC (Checkpoints) and the Postgres checkpoint registry."""
