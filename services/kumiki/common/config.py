"""Configuration from environment variables, validated once at start.

A wrong value raises `ConfigError` whose message is one line naming the variable, what is expected and
what was found; `kumiki.common.service.run_service` prints it and exits with status 2. Secrets (SASL
password, database password) come from the environment or a file named by `*_FILE`, never from code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


class ConfigError(ValueError):
    """A configuration value that is missing or wrong; the message names the variable."""


class PortInUse(RuntimeError):
    """A port the service was told to listen on is held by another socket; the message names the port and the
    variable that set it. `run_service` exits with EXIT_PORT_IN_USE, so whoever started the service (`kumiki up`)
    can tell this apart from a crash and move it to another port."""


# The exit status of a service whose gRPC or HTTP port was taken (2 is bad configuration, 3 broker or database).
EXIT_PORT_IN_USE = 4


Environ = Mapping[str, str]


def service_prefix(service: str) -> str:
    """A service's own variables start with this: `telemetry-ingest` -> KUMIKI_TELEMETRY_INGEST."""
    return "KUMIKI_" + service.upper().replace("-", "_")


def one_line(error: BaseException) -> str:
    """An error's message on one line (PyYAML's span several, with the offending text marked)."""
    return " ".join(str(error).split())


def read_json(path: Path, name: str) -> Any:
    """A JSON file's content; `name` is the option or argument that named the file, for the error."""
    try:
        return json.loads(path.read_text())
    except OSError as error:
        raise ConfigError(f"{name}: cannot read {path}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = f"{error.msg} at line {error.lineno}" if isinstance(error, json.JSONDecodeError) else error.reason
        raise ConfigError(f"{name}: {path} is not JSON ({reason})") from None


def whole_number(text: str, name: str, *, minimum: int, expected: str = "be a whole number") -> int:
    """A whole number >= minimum; `name` is the option or variable the text came from, for the error."""
    try:
        number = int(text)
    except ValueError:
        raise ConfigError(f"{name} must {expected}, got {text!r}") from None
    if number < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {number}")
    return number


def whole_numbers(text: str, name: str, *, minimum: int) -> list[int]:
    """A comma-separated list of distinct whole numbers >= minimum (seeds, cluster sizes)."""
    numbers: list[int] = []
    for part in (part.strip() for part in text.split(",")):
        if not part:
            continue
        number = whole_number(part, name, minimum=minimum, expected="list whole numbers")
        if number in numbers:
            raise ConfigError(f"{name} repeats {number}")
        numbers.append(number)
    if not numbers:
        raise ConfigError(f"{name} must list at least one whole number, e.g. {minimum},{minimum + 1}")
    return numbers


def env_str(env: Environ, name: str, default: str | None = None) -> str:
    value = env.get(name)
    if value is None or value == "":
        if default is None:
            raise ConfigError(f"{name}: required, not set")
        return default
    return value


def env_optional(env: Environ, name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def env_int(env: Environ, name: str, default: int, *, minimum: int, maximum: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer in {minimum}..{maximum}, got {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name}: expected an integer in {minimum}..{maximum}, got {raw!r}")
    return value


def env_float(env: Environ, name: str, default: float, *, minimum: float, maximum: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number in {minimum:g}..{maximum:g}, got {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"{name}: expected a number in {minimum:g}..{maximum:g}, got {raw!r}")
    return value


def env_choice(env: Environ, name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env.get(name) or default
    if value not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(choices)}, got {value!r}")
    return value


def env_bool(env: Environ, name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}: expected true or false, got {raw!r}")


def env_file(env: Environ, name: str) -> Path | None:
    raw = env.get(name)
    if not raw:
        return None
    path = Path(raw)
    try:
        found = path.is_file()
    except (OSError, ValueError) as error:  # a name too long for the filesystem, a NUL byte
        raise ConfigError(f"{name}: expected a readable file, got {raw[:80]!r} ({error.__class__.__name__})") from None
    if not found:
        raise ConfigError(f"{name}: expected a readable file, got {raw[:200]!r} (no such file)")
    return path


MIN_KEY_BYTES = 32


def read_key(path: Path, name: str) -> bytes:
    """An HMAC key from a file: surrounding whitespace stripped, at least MIN_KEY_BYTES (ConfigError names `name`).
    The jobs' key at Checkpoints and telemetry's key of the node agents' keys both come through here."""
    try:
        key = path.read_bytes().strip()
    except OSError as error:
        raise ConfigError(f"{name}: cannot read {str(path)!r}: {error.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{name}: the key in {str(path)!r} has {len(key)} bytes; at least {MIN_KEY_BYTES} (e.g. `openssl rand"
            " -hex 32`)"
        )
    return key


def env_key(env: Environ, name: str) -> bytes | None:
    """The key in the file NAME names (`read_key`); None when NAME is unset."""
    path = env_file(env, name)
    return None if path is None else read_key(path, name)


def env_secret(env: Environ, name: str) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE (Kubernetes secret mounts)."""
    path = env_file(env, f"{name}_FILE")
    if path is not None:
        return path.read_text().strip()
    return env_optional(env, name)


def _bootstrap(env: Environ, name: str, default: str) -> str:
    value = env_str(env, name, default)
    for part in value.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{name}: expected host:port[,host:port...], got {value!r}")
    return value


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach the broker; TLS and SASL are configuration away (security_protocol)."""

    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = "kumiki."
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    idempotent_producer: bool = True
    default_partitions: int = 3
    replication_factor: int = 1
    linger_ms: int = 0  # producer batching delay: 0 keeps synchronous binds fast, batches still form under load
    # an empty fetch answered before the fetch's wait is over (a broker that does not long-poll) is followed by
    # a pause of up to this much before the next (`kumiki.common.bus.pacing`); 0: none
    empty_fetch_pause_ms: int = 50

    @classmethod
    def from_env(cls, env: Environ) -> KafkaSettings:
        protocol = env_choice(
            env, "KUMIKI_KAFKA_SECURITY_PROTOCOL", "PLAINTEXT", ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
        )
        mechanism = env_optional(env, "KUMIKI_KAFKA_SASL_MECHANISM")
        if protocol.startswith("SASL"):
            mechanism = env_choice(
                env, "KUMIKI_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512", ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
            )
            env_str(env, "KUMIKI_KAFKA_SASL_USERNAME")
            if env_secret(env, "KUMIKI_KAFKA_SASL_PASSWORD") is None:
                raise ConfigError("KUMIKI_KAFKA_SASL_PASSWORD: required with SASL (or KUMIKI_KAFKA_SASL_PASSWORD_FILE)")
        prefix = env.get("KUMIKI_TOPIC_PREFIX", "kumiki.")
        if prefix and not all(ch.isalnum() or ch in "._-" for ch in prefix):
            raise ConfigError(f"KUMIKI_TOPIC_PREFIX: expected letters, digits, '.', '_' or '-', got {prefix!r}")
        return cls(
            bootstrap=_bootstrap(env, "KUMIKI_KAFKA_BOOTSTRAP", cls.bootstrap),
            topic_prefix=prefix,
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            sasl_username=env_optional(env, "KUMIKI_KAFKA_SASL_USERNAME"),
            sasl_password=env_secret(env, "KUMIKI_KAFKA_SASL_PASSWORD"),
            ssl_cafile=env_file(env, "KUMIKI_KAFKA_SSL_CAFILE"),
            ssl_certfile=env_file(env, "KUMIKI_KAFKA_SSL_CERTFILE"),
            ssl_keyfile=env_file(env, "KUMIKI_KAFKA_SSL_KEYFILE"),
            idempotent_producer=env_bool(env, "KUMIKI_KAFKA_IDEMPOTENT", True),
            default_partitions=env_int(env, "KUMIKI_KAFKA_PARTITIONS", 3, minimum=1, maximum=1024),
            replication_factor=env_int(env, "KUMIKI_KAFKA_REPLICATION", 1, minimum=1, maximum=16),
            linger_ms=env_int(env, "KUMIKI_KAFKA_LINGER_MS", 0, minimum=0, maximum=1000),
            empty_fetch_pause_ms=env_int(env, "KUMIKI_KAFKA_EMPTY_FETCH_PAUSE_MS", 50, minimum=0, maximum=1000),
        )

    def client_options(self) -> dict[str, object]:
        """Keyword arguments common to aiokafka producers, consumers and admin clients."""
        options: dict[str, object] = {"bootstrap_servers": self.bootstrap, "security_protocol": self.security_protocol}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(
                cafile=str(self.ssl_cafile) if self.ssl_cafile else None,
                certfile=str(self.ssl_certfile) if self.ssl_certfile else None,
                keyfile=str(self.ssl_keyfile) if self.ssl_keyfile else None,
            )
        if self.security_protocol.startswith("SASL"):
            options["sasl_mechanism"] = self.sasl_mechanism
            options["sasl_plain_username"] = self.sasl_username
            options["sasl_plain_password"] = self.sasl_password
        return options


@dataclass(frozen=True)
class DatabaseSettings:
    url: str = field(default="postgresql://kumiki@127.0.0.1:5432/kumiki", repr=False)
    pool_min: int = 1
    pool_max: int = 10

    @classmethod
    def from_env(cls, env: Environ) -> DatabaseSettings:
        url = env_str(env, "KUMIKI_DATABASE_URL", cls.url)
        parsed = urlparse(url)
        if parsed.scheme not in ("postgres", "postgresql") or not parsed.hostname:
            raise ConfigError("KUMIKI_DATABASE_URL: expected postgresql://user[:password]@host[:port]/database")
        password = env_secret(env, "KUMIKI_DATABASE_PASSWORD")
        if password and not parsed.password:
            netloc = f"{parsed.username or ''}:{password}@{parsed.hostname}" + (
                f":{parsed.port}" if parsed.port else ""
            )
            url = parsed._replace(netloc=netloc).geturl()
        pool_min = env_int(env, "KUMIKI_DATABASE_POOL_MIN", 1, minimum=1, maximum=100)
        pool_max = env_int(env, "KUMIKI_DATABASE_POOL_MAX", 10, minimum=1, maximum=500)
        if pool_max < pool_min:
            raise ConfigError(
                f"KUMIKI_DATABASE_POOL_MAX: expected >= KUMIKI_DATABASE_POOL_MIN ({pool_min}), got {pool_max}"
            )
        return cls(url=url, pool_min=pool_min, pool_max=pool_max)

    def redacted(self) -> str:
        parsed = urlparse(self.url)
        if parsed.password:
            return self.url.replace(f":{parsed.password}@", ":***@")
        return self.url


@dataclass(frozen=True)
class ServerSettings:
    """Where a service listens and how (mTLS is configuration away)."""

    host: str = "127.0.0.1"
    grpc_port: int = 0
    http_port: int = 0
    tls_certfile: Path | None = None
    tls_keyfile: Path | None = None
    tls_client_cafile: Path | None = None

    @classmethod
    def from_env(cls, env: Environ, prefix: str, grpc_default: int, http_default: int) -> ServerSettings:
        tls_cert = env_file(env, "KUMIKI_TLS_CERTFILE")
        tls_key = env_file(env, "KUMIKI_TLS_KEYFILE")
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("KUMIKI_TLS_KEYFILE: KUMIKI_TLS_CERTFILE and KUMIKI_TLS_KEYFILE must be set together")
        return cls(
            host=env_str(env, "KUMIKI_BIND_HOST", "127.0.0.1"),
            grpc_port=env_int(env, f"{prefix}_GRPC_PORT", grpc_default, minimum=0, maximum=65535),
            http_port=env_int(env, f"{prefix}_HTTP_PORT", http_default, minimum=0, maximum=65535),
            tls_certfile=tls_cert,
            tls_keyfile=tls_key,
            tls_client_cafile=env_file(env, "KUMIKI_TLS_CLIENT_CAFILE"),
        )


@dataclass(frozen=True)
class Settings:
    """Everything a service needs from its environment."""

    service: str
    kafka: KafkaSettings
    database: DatabaseSettings
    server: ServerSettings
    log_level: str = "INFO"
    otlp_endpoint: str | None = None
    instance: str = ""

    @classmethod
    def from_env(cls, service: str, env: Environ | None = None, *, grpc_port: int = 0, http_port: int = 0) -> Settings:
        environ: Environ = os.environ if env is None else env
        prefix = service_prefix(service)
        otlp = env_optional(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
        if otlp is not None:
            parsed = urlparse(otlp)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT: expected http(s)://host:port, got {otlp!r}")
        return cls(
            service=service,
            kafka=KafkaSettings.from_env(environ),
            database=DatabaseSettings.from_env(environ),
            server=ServerSettings.from_env(environ, prefix, grpc_port, http_port),
            log_level=env_choice(environ, "KUMIKI_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR")),
            otlp_endpoint=otlp,
            instance=env_str(environ, "KUMIKI_INSTANCE", f"{service}-{os.getpid()}"),
        )
