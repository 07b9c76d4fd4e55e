"""`kumiki kafka acls` without a broker: the formats and the refusals of bad options. Adding and checking on a
broker with an authorizer: tests/security/test_kafka_acls.py."""

from __future__ import annotations

import json

import pytest
import yaml

from kumiki.cli.main import main


def test_the_json_holds_every_rule_of_the_roles_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kafka", "acls", "--roles", "agent,quota", "--user", "quota=q-svc", "--prefix", "p.", "--format",
                 "json"]) == 0  # fmt: skip
    rules = json.loads(capsys.readouterr().out)
    assert {rule["principal"] for rule in rules} == {"User:kumiki-agent", "User:q-svc"}
    assert {"principal": "User:q-svc", "resource": "GROUP", "name": "kumiki-quota", "pattern": "LITERAL",
            "operation": "READ"} in rules  # fmt: skip
    assert all(rule["name"].startswith("p.") for rule in rules if rule["resource"] == "TOPIC")


def test_strimzi_users_one_per_user(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUMIKI_TOPIC_PREFIX", "prod.")
    assert main(["kafka", "acls", "--format", "strimzi", "--strimzi-cluster", "bus"]) == 0
    users = list(yaml.safe_load_all(capsys.readouterr().out))
    assert sorted(user["metadata"]["name"] for user in users) == sorted(
        ["kumiki-placement", "kumiki-quota", "kumiki-forecast", "kumiki-preemption", "kumiki-telemetry-ingest",
         "kumiki-binder", "kumiki-agent", "kumiki-subscriber"]
    )  # fmt: skip
    assert {user["metadata"]["labels"]["strimzi.io/cluster"] for user in users} == {"bus"}
    names = {acl["resource"]["name"] for user in users for acl in user["spec"]["authorization"]["acls"]}
    assert "prod.job.lifecycle" in names and "kumiki.job.lifecycle" not in names


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--roles", "agent,bogus"], "--roles: unknown role 'bogus'"),
        (["--roles", " , "], "--roles must name at least one role"),
        (["--user", "agent"], "--user: expected ROLE=USER, got 'agent'"),
        (["--roles", "agent", "--user", "quota=q"], "--user: role 'quota' is not among --roles (agent)"),
        (["--user", "agent=a;b"], "--user: agent: a Kafka user name without spaces"),
        (["--prefix", "bad prefix"], "--prefix: expected letters, digits"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["kafka", "acls", *argv])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith(f"kumiki kafka: error: {message}"), error
    assert len(error.strip().splitlines()) == 1
