"""Creating the registry's topics at start-up when they are missing; listing and adding the bus's ACLs."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
)
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest

from kumiki.common.bus.access import AclBinding
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


def refused(settings: KafkaSettings, what: str, code: str) -> BrokerUnavailable:
    """A broker with ACLs refusing this process's user: one line naming the variable, what was refused, and where
    the user's ACLs come from."""
    return BrokerUnavailable(
        f"KUMIKI_KAFKA_SASL_USERNAME: the broker at {settings.bootstrap} does not let user"
        f" {settings.sasl_username or 'ANONYMOUS'!r} use {what} ({code}): is this the service's own user?"
        " Its ACLs: kumiki kafka acls"
    )


def refused_by_authorizer(
    settings: KafkaSettings, error: GroupAuthorizationFailedError | TopicAuthorizationFailedError
) -> BrokerUnavailable:
    """The same line for aiokafka's authorization errors met while running (joining a group, fetching a topic
    the service declares but the broker's ACLs leave out)."""
    named = ", ".join(map(str, error.args))
    if isinstance(error, GroupAuthorizationFailedError):
        return refused(settings, f"consumer group {named}", "GROUP_AUTHORIZATION_FAILED")
    return refused(settings, f"topic {named}", "TOPIC_AUTHORIZATION_FAILED")


async def _admin_client(settings: KafkaSettings) -> AIOKafkaAdminClient:
    admin = AIOKafkaAdminClient(**settings.client_options(), request_timeout_ms=15000)
    await start_client(admin, settings)
    return admin


async def ensure_topics(settings: KafkaSettings, specs: Iterable[TopicSpec]) -> list[str]:
    """Create the topics that do not exist yet; return the names created."""
    admin = await _admin_client(settings)
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
                elif code == 29:  # TOPIC_AUTHORIZATION_FAILED: a broker with ACLs that grant this user no CREATE
                    raise refused(settings, f"topic {name}", "TOPIC_AUTHORIZATION_FAILED")
                elif code != TopicAlreadyExistsError.errno:
                    message = rest[0] if rest else ""
                    raise BrokerUnavailable(f"creating topic {name} failed: error {code} {message}")
        if created:
            log.info("created topics", extra={"topics": ",".join(created)})
        return created
    finally:
        await admin.close()


# Kafka's wire codes for ACLs (org.apache.kafka.common.acl / resource): the names AclBinding carries.
_RESOURCE_CODES = {"TOPIC": 2, "GROUP": 3}
_PATTERN_CODES = {"LITERAL": 3, "PREFIXED": 4}
_OPERATION_CODES = {"ALL": 2, "READ": 3, "WRITE": 4, "CREATE": 5, "DELETE": 6, "ALTER": 7, "DESCRIBE": 8}
_ANY, _MATCH_ANY_PATTERN, _ALLOW = 1, 1, 3


def _named(codes: dict[str, int], code: int) -> str:
    return next((name for name, value in codes.items() if value == code), f"CODE_{code}")


def _acl_failure(settings: KafkaSettings, what: str, code: int, message: str | None) -> BrokerUnavailable:
    if code == 31:  # CLUSTER_AUTHORIZATION_FAILED: not a super user, no ALTER/DESCRIBE on the cluster
        message = f"user {settings.sasl_username!r} may not manage ACLs (run it as the broker's admin)"
    elif code == 54:  # SECURITY_DISABLED
        message = "the broker runs no authorizer (authorizer.class.name is not set)"
    return BrokerUnavailable(f"{what}: error {code}: {message or 'no message'}")


async def describe_acls(settings: KafkaSettings) -> list[AclBinding]:
    """Every ALLOW rule on topics and groups the broker holds (DescribeAcls v1+, what kafka-acls --list asks).
    aiokafka's admin client has no ACL calls; it does carry the protocol's requests, sent here as they are."""
    admin = await _admin_client(settings)
    try:
        rules = []
        for resource, resource_code in _RESOURCE_CODES.items():
            request = DescribeAclsRequest(resource_code, None, _MATCH_ANY_PATTERN, None, None, _ANY, _ALLOW)
            response = await admin._send_request(request)
            if response.error_code:
                raise _acl_failure(settings, "listing ACLs", response.error_code, response.error_message)
            for _, name, pattern, acls in response.resources:
                for principal, _host, operation, _permission in acls:
                    rules.append(
                        AclBinding(
                            principal,
                            resource,
                            name,
                            _named(_PATTERN_CODES, pattern),
                            _named(_OPERATION_CODES, operation),
                        )
                    )
        return sorted(rules)
    finally:
        await admin.close()


async def create_acls(settings: KafkaSettings, bindings: Iterable[AclBinding]) -> int:
    """Add ALLOW rules (any host); a rule the broker holds already is added again as a no-op. Returns how many
    were sent; the first refusal raises BrokerUnavailable naming the rule."""

    def request(rule: AclBinding) -> Any:
        return CreateAclsRequest(*_rule_codes(rule, host="*"))

    def errors(response: Any) -> Iterable[tuple[int, str | None]]:
        return [(code, message) for code, message in response.creation_responses]

    return await _each_rule(settings, bindings, "adding", request, errors)


async def delete_acls(settings: KafkaSettings, bindings: Iterable[AclBinding]) -> int:
    """Remove ALLOW rules (on any host); a rule the broker does not hold is no error. Returns how many were sent."""

    def request(rule: AclBinding) -> Any:
        return DeleteAclsRequest(*_rule_codes(rule, host=None))

    def errors(response: Any) -> Iterable[tuple[int, str | None]]:
        return [(code, message) for code, message, _matching in response.filter_responses]

    return await _each_rule(settings, bindings, "removing", request, errors)


def _rule_codes(rule: AclBinding, host: str | None) -> tuple[int, str, int, str, str | None, int, int]:
    return (
        _RESOURCE_CODES[rule.resource],
        rule.name,
        _PATTERN_CODES[rule.pattern],
        rule.principal,
        host,
        _OPERATION_CODES[rule.operation],
        _ALLOW,
    )


async def _each_rule(
    settings: KafkaSettings,
    bindings: Iterable[AclBinding],
    verb: str,
    request: Callable[[AclBinding], Any],
    errors: Callable[[Any], Iterable[tuple[int, str | None]]],
) -> int:
    """One request per rule (aiokafka's request objects carry one each); the first refusal raises, naming it."""
    admin = await _admin_client(settings)
    sent = 0
    try:
        for rule in bindings:
            response = await admin._send_request(request(rule))
            for code, message in errors(response):
                if code:
                    what = f"{verb} {rule.operation} on {rule.resource.lower()} {rule.name} for {rule.principal}"
                    raise _acl_failure(settings, what, code, message)
            sent += 1
        return sent
    finally:
        await admin.close()
