"""Prometheus metrics of the bus, shared by every producer and consumer in a process."""

from prometheus_client import Counter, Histogram

PUBLISHED = Counter("kumiki_bus_published_total", "Events published", ["topic"])
CONSUMED = Counter("kumiki_bus_consumed_total", "Events handled successfully", ["topic", "group"])
DEAD_LETTERED = Counter("kumiki_bus_dead_lettered_total", "Records sent to the dead-letter topic", ["topic", "group"])
DUPLICATES = Counter(
    "kumiki_bus_duplicates_total", "Records skipped as already handled (same ce_id)", ["topic", "group"]
)
REDELIVERED = Counter(
    "kumiki_bus_redelivered_total",
    "Records skipped because the Postgres-stored offset is past them (applied already)",
    ["topic", "group"],
)
GAPS = Counter(
    "kumiki_bus_offset_gaps_total",
    "Batches that started after the Postgres-stored offset (the consumer went back for the records between)",
    ["topic", "group"],
)
HANDLER_SECONDS = Histogram(
    "kumiki_bus_handler_seconds",
    "Time to handle one event",
    ["topic", "group"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)
PUBLISH_ROUND_RECORDS = Histogram(
    "kumiki_bus_publish_round_records",
    "Records per publish round (calls made while a round is in flight share the next one)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096),
)
