"""Our broker settings in faust's spelling, without a broker."""

from __future__ import annotations

import ssl

import faust

from kumiki.common.config import KafkaSettings
from kumiki.telemetry.adapters.faust_app import faust_broker_options


def test_plaintext_names_every_bootstrap_server_and_no_credentials() -> None:
    settings = KafkaSettings(bootstrap="a:9092, b:9093", default_partitions=6, replication_factor=3)
    assert faust_broker_options(settings) == {
        "broker": "kafka://a:9092,kafka://b:9093",
        "topic_replication_factor": 3,
        "topic_partitions": 6,
    }


def test_tls_and_sasl_become_faust_credentials() -> None:
    tls = faust_broker_options(KafkaSettings(bootstrap="a:9093", security_protocol="SSL"))["broker_credentials"]
    assert isinstance(tls, faust.SSLCredentials) and isinstance(tls.context, ssl.SSLContext)

    sasl = faust_broker_options(
        KafkaSettings(
            bootstrap="a:9094",
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="telemetry",
            sasl_password="secret",
        )
    )["broker_credentials"]
    assert isinstance(sasl, faust.SASLCredentials)
    assert (sasl.username, sasl.password, sasl.mechanism.value) == ("telemetry", "secret", "SCRAM-SHA-512")
    assert isinstance(sasl.ssl_context, ssl.SSLContext)

    plain = faust_broker_options(
        KafkaSettings(bootstrap="a:9094", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u")
    )["broker_credentials"]
    assert isinstance(plain, faust.SASLCredentials) and plain.ssl_context is None
