"""Adapters of the forecast service: job history in Postgres, lifecycle consumer, gRPC Forecaster."""
