"""Adapters of the placement service: gRPC Placement."""
