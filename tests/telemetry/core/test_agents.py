"""Which node an agent's token lets a record name: its own pod's node, under an agent's service account."""

from __future__ import annotations

import re

import pytest

from kumiki.telemetry.core import (
    AGENT_SIGNATURE_HEADER,
    AGENT_TOKEN_HEADER,
    AgentProof,
    agent_refusal,
    missing_proof,
    node_key,
    parse_accounts,
    parse_generations,
    signature,
    signature_refusal,
)

AGENTS = frozenset({"kumiki/kumiki-agent"})
AGENT_A = AgentProof(pod="kumiki/agent-x7", account="kumiki/kumiki-agent", node="node-a")


def test_an_agent_speaks_for_its_own_node() -> None:
    assert agent_refusal("node-a", AGENT_A, AGENTS) is None


def test_an_agent_naming_another_node_is_refused_naming_both() -> None:
    assert agent_refusal("node-b", AGENT_A, AGENTS) == (
        "node: 'node-b' is not the node of the agent that sent it (pod kumiki/agent-x7 runs on node 'node-a')"
    )


def test_a_pod_not_yet_scheduled_speaks_for_no_node() -> None:
    unscheduled = AgentProof(pod="kumiki/agent-x7", account="kumiki/kumiki-agent", node="")
    reason = agent_refusal("node-a", unscheduled, AGENTS)
    assert reason is not None and "runs on no node yet" in reason


def test_another_service_account_on_the_right_node_is_refused() -> None:
    trainer = AgentProof(pod="ml/train-0", account="ml/trainer", node="node-a")
    assert agent_refusal("node-a", trainer, AGENTS) == (
        f"{AGENT_TOKEN_HEADER}: pod ml/train-0 runs as service account ml/trainer, which is not an agent's"
        " (KUMIKI_TELEMETRY_AGENT_ACCOUNTS: kumiki/kumiki-agent)"
    )


def test_no_token_and_a_refused_token_name_the_header() -> None:
    missing = agent_refusal("node-a", None, AGENTS)
    assert missing is not None and missing.startswith(f"{AGENT_TOKEN_HEADER}: missing: node 'node-a'")
    refused = AgentProof(refusal="pod kumiki/agent-x7 no longer exists")
    assert agent_refusal("node-a", refused, AGENTS) == f"{AGENT_TOKEN_HEADER}: pod kumiki/agent-x7 no longer exists"


def test_accounts_parse_and_name_a_bad_entry() -> None:
    assert parse_accounts(" kumiki/kumiki-agent, gpu-ops/dcgm-agent ,") == {"kumiki/kumiki-agent", "gpu-ops/dcgm-agent"}
    for bad in ("kumiki-agent", "kumiki/", "/agent", "a/b/c", "kumiki/kumiki agent"):
        with pytest.raises(ValueError, match=r"KUMIKI_TELEMETRY_AGENT_ACCOUNTS: .* is not namespace/name"):
            parse_accounts(f"kumiki/ok,{bad}")
    with pytest.raises(ValueError, match="name the agents' service accounts"):
        parse_accounts(" , ")


MASTER = b"0123456789abcdef0123456789abcdef-telemetry"


def test_a_nodes_key_signs_for_that_node_only() -> None:
    value = b"\x0a\x06node-a\x12\x05GPU-0"
    key_a = node_key(MASTER, "node-a")
    assert len(key_a) == 64 and key_a != node_key(MASTER, "node-b") != node_key(b"another key" * 4, "node-a")
    signed = signature(key_a, value)
    assert signature_refusal("node-a", value, signed, key_a) is None
    assert signature_refusal("node-b", value, signed, node_key(MASTER, "node-b")) == (
        f"{AGENT_SIGNATURE_HEADER}: does not match node 'node-b''s key: signed by another node's agent, or the"
        " record was changed"
    )
    assert signature_refusal("node-a", value + b"\x18\x01", signed, key_a) is not None  # a changed record
    assert signature_refusal("node-a", value, b"", key_a) is not None


def test_a_record_with_no_proof_names_what_telemetry_takes() -> None:
    assert missing_proof("node-a", tokens=True, keys=True) == (
        f"{AGENT_TOKEN_HEADER}: missing: node 'node-a''s records must carry its agent's token (the agent's"
        " --token-file) or its agent's signature (the agent's --node-key-file)"
    )
    assert missing_proof("node-a", tokens=False, keys=True).startswith(f"{AGENT_SIGNATURE_HEADER}: missing: ")


def test_a_nodes_next_generation_withdraws_its_key_alone() -> None:
    value = b"\x0a\x06node-a\x12\x05GPU-0"
    first, second = node_key(MASTER, "node-a"), node_key(MASTER, "node-a", 2)
    assert node_key(MASTER, "node-a", 0) == first and len(second) == 64 and second != first
    assert node_key(MASTER, "node-a", 2) != node_key(MASTER, "node-b", 2)
    assert signature_refusal("node-a", value, signature(second, value), second, 2) is None
    assert signature_refusal("node-a", value, signature(first, value), second, 2) == (
        f"{AGENT_SIGNATURE_HEADER}: does not match node 'node-a''s key of generation 2: a withdrawn key, signed by"
        " another node's agent, or the record was changed"
    )


def test_generations_parse_and_name_the_line() -> None:
    assert parse_generations("# withdrawn keys\n\ngpu-7 2  # copied from its disk\ngpu-9 1\n") == {
        "gpu-7": 2,
        "gpu-9": 1,
    }
    assert parse_generations("") == {}
    for text, says in (
        ("gpu-7", "line 1: expected '<node> <generation>', got 'gpu-7'"),
        ("gpu-7 2\ngpu-8 0", "line 2: generation of 'gpu-8' must be a whole number in [1, 1000000], got '0'"),
        ("gpu-7 two", "got 'two'"),
        ("gpu-7 2\ngpu-7 3", "line 2: node 'gpu-7' is listed twice"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_generations(text, "generations")
