"""Creating the registry's topics at start-up when they are missing."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaConnectionError, SaslAuthenticationFailed, TopicAlreadyExistsError

from kumiki.common.bus.pacing import pace_empty_fetches
from kumiki.common.bus.topics import TopicSpec
from kumiki.common.config import KafkaSettings

log = logging.getLogger(__name__)


class BrokerUnavailable(RuntimeError):
    """The broker cannot be reached; the message names the bootstrap address."""


class _BootstrapErrors(logging.Filter):
    """aiokafka's 'Unable connect to' records during one start, kept (not logged): the reason of the one line."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[object] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg.startswith("Unable connect to") and record.args:
            self.errors.append(record.args[-1] if isinstance(record.args, tuple) else record.args)
            return False
        return True


def _why(settings: KafkaSettings, errors: list[object]) -> str | None:
    """The configuration to blame for a failed bootstrap, as one line naming the variable; None if unclear."""
    for error in errors:
        text = str(error)
        if isinstance(error, SaslAuthenticationFailed) or "SaslAuthenticationFailed" in text:
            return (
                f"KUMIKI_KAFKA_SASL_PASSWORD: the broker at {settings.bootstrap} refused user"
                f" {settings.sasl_username!r} ({settings.sasl_mechanism}): wrong password or unknown user"
            )
        if isinstance(error, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
            trusted = f"the CA in {str(settings.ssl_cafile)!r}" if settings.ssl_cafile else "the system's CAs"
            reason = getattr(error, "verify_message", None) or text.rpartition("certificate verify failed: ")[2]
            return (
                f"KUMIKI_KAFKA_SSL_CAFILE: the broker at {settings.bootstrap} presented a certificate that"
                f" {trusted} did not sign ({reason.split(' (_ssl')[0]})"
            )
        if isinstance(error, ssl.SSLError):
            return f"KUMIKI_KAFKA_SECURITY_PROTOCOL: TLS with the broker at {settings.bootstrap} failed ({error})"
    return None


async def start_client(client: Any, settings: KafkaSettings) -> None:
    """Start an aiokafka client, or raise BrokerUnavailable: one line naming the variable to fix (the address,
    the SASL password, the CA) instead of aiokafka's error per attempt and a bootstrap failure. Consumers started
    in this process from here on pace the empty fetches a broker answers at once (`pace_empty_fetches`)."""
    pace_empty_fetches(settings.empty_fetch_pause_ms / 1000.0)
    seen = _BootstrapErrors()
    loggers = [logging.getLogger(name) for name in ("aiokafka", "aiokafka.client")]  # it logs on the first
    for logger in loggers:
        logger.addFilter(seen)
    try:
        await client.start()
    except KafkaConnectionError as error:
        raise BrokerUnavailable(
            _why(settings, seen.errors)
            or f"KUMIKI_KAFKA_BOOTSTRAP: cannot reach a Kafka broker at {settings.bootstrap} ({error})"
        ) from None
    finally:
        for logger in loggers:
            logger.removeFilter(seen)


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
