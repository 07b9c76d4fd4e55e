"""Creating the registry's topics at start-up when they are missing."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, TopicAlreadyExistsError

from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """The broker cannot be reached; the message names the bootstrap address."""


async def start_client(client: Any, settings: KafkaSettings) -> None:
    """Start an aiokafka client, or raise BrokerUnavailable naming the variable and the address."""
    try:
        await client.start()
    except KafkaConnectionError as error:
        raise BrokerUnavailable(
            f"KUMIKI_KAFKA_BOOTSTRAP: cannot reach a Kafka broker at {settings.bootstrap} ({error})"
        ) from None


async def ensure_topics(settings: KafkaSettings, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = AIOKafkaAdminClient(**settings.client_options(), request_timeout_ms=15000)
    await start_client(admin, settings)
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(
                name=spec.full_name(settings.topic_prefix),
                num_partitions=spec.partitions or settings.default_partitions,
                replication_factor=settings.replication_factor,
                topic_configs=spec.configs(),
            )
            for spec in specs
            if spec.full_name(settings.topic_prefix) not in existing
        ]
        created = []
        for topic in missing:  # one by one: a concurrent creator must not fail the others
            try:
                response = await admin.create_topics([topic])
            except TopicAlreadyExistsError:
                continue
            for name, code, *rest in response.topic_errors:
                if code == 0:
                    created.append(name)
                elif code != TopicAlreadyExistsError.errno:
                    message = rest[0] if rest else ""
                    raise BrokerUnavailable(f"creating topic {name} failed: error {code} {message}")
        if created:
            log.info("created topics", extra={"topics": ",".join(created)})
        return created
    finally:
        await admin.close()
