"""Adapters of the quota service: gRPC Quota."""
