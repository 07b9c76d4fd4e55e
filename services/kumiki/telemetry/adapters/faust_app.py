"""Telemetry's faust app: our broker settings in faust's spelling, and the app settings the worker runs with."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, cast

import faust

from kumiki.common.config import KafkaSettings
from kumiki.telemetry import core


def faust_broker_options(settings: KafkaSettings) -> dict[str, Any]:
    """faust's spelling of our broker settings (TLS and SASL included)."""
    options: dict[str, Any] = {
        "broker": ",".join(f"kafka://{part.strip()}" for part in settings.bootstrap.split(",")),
        "topic_replication_factor": settings.replication_factor,
        "topic_partitions": settings.default_partitions,
    }
    client = settings.client_options()
    ssl_context: Any = client.get("ssl_context")
    if settings.security_protocol.startswith("SASL"):
        options["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password,
            mechanism=settings.sasl_mechanism,
            ssl_context=ssl_context,
        )
    elif ssl_context is not None:
        options["broker_credentials"] = faust.SSLCredentials(ssl_context)
    return options


def telemetry_app(app_id: str, settings: KafkaSettings, config: core.TelemetryConfig, batch_size: int) -> Any:
    """The faust app (memory tables, at least once); `app_id` names its consumer group and changelog topics."""
    return cast(Any, faust.App)(
        app_id,
        **faust_broker_options(settings),
        store="memory://",
        # faust makes a data folder even for memory tables; keep it out of the working directory
        datadir=str(Path(tempfile.gettempdir()) / f"kumiki-faust-{app_id}"),
        web_enabled=False,
        topic_disable_leader=True,
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger=0.005,  # batch changelog and internal records: one request per chunk burst
        stream_wait_empty=False,
        broker_commit_every=batch_size,
        broker_commit_interval=1.0,
        stream_buffer_maxsize=max(4096, 2 * batch_size),
        table_cleanup_interval=60.0,
        broker_session_timeout=config.session_timeout_s,
        broker_heartbeat_interval=min(3.0, config.session_timeout_s / 3),
        logging_config=None,
    )


def raw_topic(app: Any, name: str) -> Any:
    """A topic read as bytes: stage 1 and the lifecycle agent decode with the bus codec themselves."""
    return app.topic(name, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
