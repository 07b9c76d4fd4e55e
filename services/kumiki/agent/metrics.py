"""The node agent's own Prometheus metrics, served on --metrics-port (KUMIKI_AGENT_METRICS_PORT) when set.

The agent has no other HTTP server; prometheus_client's threaded one costs nothing while nobody scrapes. These
are the agent's health as the node sees it (ticks, samples, errors by kind); what the samples say is counted by
telemetry-ingest."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

TICKS = Counter("kumiki_agent_ticks_total", "Sampling ticks run", ["node"])
SAMPLES = Counter("kumiki_agent_samples_total", "GPU samples handed to the sink (published)", ["node"])
SKIPPED_TICKS = Counter("kumiki_agent_skipped_ticks_total", "Ticks skipped because sampling fell behind", ["node"])
ERRORS = Counter(
    "kumiki_agent_errors_total", "Failed ticks and publishes, and source errors by kind", ["node", "stage"]
)
GPUS = Gauge("kumiki_agent_gpus", "GPUs in the node's inventory (MIG parents counted once)", ["node"])
LAST_SAMPLE = Gauge("kumiki_agent_last_sample_timestamp_seconds", "Wall time of the newest published sample", ["node"])


def serve(port: int, host: str) -> None:
    """Serve /metrics from a daemon thread (the sampling loop never waits on a scrape)."""
    start_http_server(port, addr=host)
