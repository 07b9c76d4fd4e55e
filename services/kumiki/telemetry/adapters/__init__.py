"""Adapters of telemetry ingest: the gpu.samples consumer and its Prometheus gauges."""
