import subprocess
import sys
from pathlib import Path

import pytest

from kumiki.common.config import ConfigError, Settings, env_key, read_json, whole_numbers


def settings(**env: str) -> Settings:
    return Settings.from_env("placement", env, grpc_port=50051, http_port=8081)


def test_defaults_are_valid() -> None:
    loaded = settings()
    assert loaded.kafka.bootstrap == "127.0.0.1:9092"
    assert loaded.server.grpc_port == 50051
    assert loaded.kafka.security_protocol == "PLAINTEXT"
    assert loaded.kafka.empty_fetch_pause_ms == 50


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KUMIKI_KAFKA_BOOTSTRAP": "localhost"}, "KUMIKI_KAFKA_BOOTSTRAP: expected host:port"),
        ({"KUMIKI_PLACEMENT_GRPC_PORT": "seventy"}, "KUMIKI_PLACEMENT_GRPC_PORT: expected an integer in 0..65535"),
        ({"KUMIKI_PLACEMENT_HTTP_PORT": "70000"}, "KUMIKI_PLACEMENT_HTTP_PORT: expected an integer in 0..65535"),
        ({"KUMIKI_DATABASE_URL": "mysql://x@h/db"}, "KUMIKI_DATABASE_URL: expected postgresql://"),
        ({"KUMIKI_LOG_LEVEL": "LOUD"}, "KUMIKI_LOG_LEVEL: expected one of DEBUG, INFO, WARNING, ERROR"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "jaeger:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT: expected http(s)://host:port"),
        (
            {"KUMIKI_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "KUMIKI_KAFKA_SASL_USERNAME": "u"},
            "KUMIKI_KAFKA_SASL_PASSWORD: required with SASL",
        ),
        ({"KUMIKI_KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"}, "KUMIKI_KAFKA_SSL_CAFILE: expected a readable file"),
        ({"KUMIKI_TLS_CERTFILE": __file__}, "KUMIKI_TLS_KEYFILE: KUMIKI_TLS_CERTFILE and KUMIKI_TLS_KEYFILE"),
        ({"KUMIKI_DATABASE_POOL_MIN": "5", "KUMIKI_DATABASE_POOL_MAX": "2"}, "KUMIKI_DATABASE_POOL_MAX: expected >="),
        ({"KUMIKI_KAFKA_EMPTY_FETCH_PAUSE_MS": "-5"}, "KUMIKI_KAFKA_EMPTY_FETCH_PAUSE_MS: expected an integer"),
    ],
)
def test_wrong_values_name_the_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings(**env)
    assert str(error.value).startswith(named)


def test_secrets_come_from_files_and_are_not_printed(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    loaded = settings(
        KUMIKI_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT",
        KUMIKI_KAFKA_SASL_USERNAME="kumiki",
        KUMIKI_KAFKA_SASL_PASSWORD_FILE=str(secret),
        KUMIKI_DATABASE_PASSWORD_FILE=str(secret),
        KUMIKI_DATABASE_URL="postgresql://kumiki@db:5432/kumiki",
    )
    assert loaded.kafka.sasl_password == "s3cret"
    assert loaded.kafka.client_options()["sasl_plain_password"] == "s3cret"
    assert "s3cret" not in repr(loaded)
    assert loaded.database.url == "postgresql://kumiki:s3cret@db:5432/kumiki"
    assert loaded.database.redacted() == "postgresql://kumiki:***@db:5432/kumiki"


def test_service_exits_with_one_line_naming_the_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kumiki.placement"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"KUMIKI_PLACEMENT_GRPC_PORT": "abc", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "kumiki-placement: configuration error: KUMIKI_PLACEMENT_GRPC_PORT: expected an integer in 0..65535, got 'abc'"
    ]


def test_whole_numbers_keep_their_order_and_skip_blanks() -> None:
    assert whole_numbers(" 3, 0,,12 ", "--seeds", minimum=0) == [3, 0, 12]


@pytest.mark.parametrize(
    ("text", "minimum", "message"),
    [
        ("1,a", 0, "--x must list whole numbers, got 'a'"),
        ("2,0", 1, "--x must be >= 1, got 0"),
        ("4,5,4", 0, "--x repeats 4"),
        (" , ", 0, "--x must list at least one whole number"),
        ("1.5", 0, "--x must list whole numbers, got '1.5'"),
    ],
)
def test_whole_numbers_name_the_option_and_the_bad_part(text: str, minimum: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        whole_numbers(text, "--x", minimum=minimum)


def test_a_json_file_is_read_and_a_missing_or_broken_one_is_named_with_its_option(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text('{"phases": {}}')
    assert read_json(good, "--run") == {"phases": {}}
    with pytest.raises(ConfigError, match=r"^--run: cannot read .*missing\.json: No such file"):
        read_json(tmp_path / "missing.json", "--run")
    broken = tmp_path / "broken.json"
    broken.write_text('{"phases": ')
    with pytest.raises(ConfigError, match=r"^--run: .*broken\.json is not JSON \(Expecting value at line 1\)"):
        read_json(broken, "--run")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"^reports: .*binary\.json is not JSON"):
        read_json(binary, "reports")


def test_a_key_is_read_stripped_and_refused_under_32_bytes_naming_its_variable(tmp_path: Path) -> None:
    """The one reader of HMAC keys (Checkpoints' jobs' key, telemetry's key of the agents' keys)."""
    good, short = tmp_path / "good.key", tmp_path / "short.key"
    good.write_bytes(b"  " + b"k" * 32 + b"\n")
    short.write_bytes(b"k" * 31 + b"   ")
    assert env_key({"KUMIKI_X_KEY_FILE": str(good)}, "KUMIKI_X_KEY_FILE") == b"k" * 32
    assert env_key({}, "KUMIKI_X_KEY_FILE") is None
    with pytest.raises(ConfigError, match=r"^KUMIKI_X_KEY_FILE: the key in '.*short.key' has 31 bytes; at least 32"):
        env_key({"KUMIKI_X_KEY_FILE": str(short)}, "KUMIKI_X_KEY_FILE")
    with pytest.raises(ConfigError, match=r"^KUMIKI_X_KEY_FILE: expected a readable file"):
        env_key({"KUMIKI_X_KEY_FILE": str(tmp_path / "missing")}, "KUMIKI_X_KEY_FILE")
