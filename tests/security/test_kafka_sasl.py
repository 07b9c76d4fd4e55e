"""Apache Kafka that requires SASL_SSL with SCRAM-SHA-512, for real: certificates from a test CA generated here
(kumiki.devstack.tls), users created with Kafka's own tools (kafka-storage format --add-scram before the start,
kafka-configs on the running broker). Every service and the node agent connect with credentials from files
(KUMIKI_KAFKA_SASL_PASSWORD_FILE, KUMIKI_KAFKA_SSL_CAFILE); a wrong password or an unknown CA stops the process
at start with one clear line naming the variable, and no traceback."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kumiki.devstack.broker import add_scram_user
from kumiki.devstack.processes import free_port
from kumiki.devstack.tls import DevelopmentCA
from tests.conftest import read_records
from tests.security.support import (
    SERVICES,
    SecureBroker,
    process_env,
    record_dcgm_page,
    run_agent,
    secret_file,
    secure_kafka,
    services_running,
)

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    folder = tmp_path_factory.mktemp("sasl")
    with secure_kafka(folder, ["kumiki-services"]) as (broker, secure):
        agent_password = secrets.token_urlsafe(18)
        add_scram_user(broker.bootstrap, secure, "kumiki-agent", agent_password, folder)  # kafka-configs
        broker.passwords["kumiki-agent"] = secret_file(folder, "kumiki-agent", agent_password)
        yield broker


def test_every_service_and_the_agent_connect_with_credentials_from_files(
    secure_broker: SecureBroker, database_url: str, tmp_path: Path
) -> None:
    prefix = f"sasl-{uuid.uuid4().hex[:8]}."
    queues = tmp_path / "queues.yaml"
    queues.write_text(json.dumps({"cluster": {"gpus": {"A100": 8}}, "queues": [{"name": "team-a"}]}))
    common = {
        **secure_broker.env("kumiki-services"),
        "KUMIKI_TOPIC_PREFIX": prefix,
        "KUMIKI_DATABASE_URL": database_url,
        "KUMIKI_QUOTA_ALLOW_ANONYMOUS": "true",
        "KUMIKI_QUOTA_CONFIG_FILE": str(queues),
    }
    with services_running(dict.fromkeys(SERVICES, common), tmp_path):
        # the agent, as its own SCRAM user (created by kafka-configs), replays a DCGM page's samples
        recording, samples = record_dcgm_page(tmp_path)
        agent = run_agent(recording, {**secure_broker.env("kumiki-agent"), "KUMIKI_TOPIC_PREFIX": prefix})
        assert agent.returncode == 0, agent.stderr[-2000:]
        records = asyncio.run(
            read_records(secure_broker.settings("kumiki-services", prefix), f"{prefix}gpu.samples", samples)
        )
        assert len(records) >= samples


def _informational(line: str) -> bool:
    """A service's JSON log line or the agent's text log line below WARNING: not the error line."""
    if line.startswith("{"):
        return json.loads(line).get("level") in ("DEBUG", "INFO")
    return re.match(r"^\d{4}-\d\d-\d\d [\d:,]+ (DEBUG|INFO) ", line) is not None


def _start_fails(argv: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    result = subprocess.run(argv, env=process_env(env), capture_output=True, text=True, timeout=120)
    return result.returncode, [line for line in result.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("who", ["placement", "agent"])
def test_a_wrong_password_fails_at_start_with_one_clear_line(
    secure_broker: SecureBroker, tmp_path: Path, who: str
) -> None:
    wrong = secret_file(tmp_path, "wrong", "not-the-password")
    user = "kumiki-agent" if who == "agent" else "kumiki-services"
    env = {**secure_broker.env(user, password_file=wrong), "KUMIKI_TOPIC_PREFIX": "sasl-wrong."}
    argv = [sys.executable, "-m", "kumiki.placement"]
    if who == "agent":
        (tmp_path / "rec").mkdir()
        argv = [sys.executable, "-m", "kumiki.agent", "--node", "n1", "--replay", str(tmp_path / "rec"), "--output",
                "kafka"]  # fmt: skip
    else:
        env["KUMIKI_PLACEMENT_GRPC_PORT"], env["KUMIKI_PLACEMENT_HTTP_PORT"] = str(free_port()), str(free_port())
    code, lines = _start_fails(argv, env)
    assert code == 3, lines
    assert not any("Traceback" in line for line in lines), lines
    plain = [line for line in lines if not _informational(line)]
    assert plain == [
        f"{'python -m kumiki.agent' if who == 'agent' else 'kumiki-placement'}: KUMIKI_KAFKA_SASL_PASSWORD: the broker"
        f" at {secure_broker.bootstrap} refused user '{user}' (SCRAM-SHA-512): wrong password or unknown user"
    ], lines


def test_an_unknown_ca_fails_at_start_with_one_clear_line(secure_broker: SecureBroker, tmp_path: Path) -> None:
    other = DevelopmentCA.create(tmp_path / "other", common_name="Not the broker's CA")
    env = {
        **secure_broker.env("kumiki-services", cafile=other.cafile),
        "KUMIKI_TOPIC_PREFIX": "sasl-ca.",
        "KUMIKI_PLACEMENT_GRPC_PORT": str(free_port()),
        "KUMIKI_PLACEMENT_HTTP_PORT": str(free_port()),
    }
    code, lines = _start_fails([sys.executable, "-m", "kumiki.placement"], env)
    assert code == 3, lines
    assert not any("Traceback" in line for line in lines), lines
    plain = [line for line in lines if not _informational(line)]
    assert plain == [
        f"kumiki-placement: KUMIKI_KAFKA_SSL_CAFILE: the broker at {secure_broker.bootstrap} presented a certificate"
        f" that the CA in '{other.cafile}' did not sign (unable to get local issuer certificate)"
    ], lines
