"""Adapters of the node agent: NVML (pynvml), the DCGM exporter, JSON-lines sinks and recordings."""
