"""Node agent: GPU inventory and samples from NVML (pynvml) or dcgm-exporter, for telemetry ingest."""
