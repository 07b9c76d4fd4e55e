"""Withdrawing one node's key while telemetry runs: the generations file read again when it changes, the old key
refused with the generation named, the new one taken, every other node's key unchanged, a bad edit survived."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kumiki.common.config import ConfigError
from kumiki.telemetry.adapters.agent_identity import AgentIdentity, KeyGenerations
from kumiki.telemetry.core import AGENT_SIGNATURE_HEADER, node_key, signature

MASTER = b"0123456789abcdef0123456789abcdef-telemetry"
RECORD = b"\x0a\x06gpu-7\x12\x05GPU-0"


def signed(node: str, key: bytes) -> tuple[str, list[tuple[str, bytes]], bytes]:
    return node, [(AGENT_SIGNATURE_HEADER, signature(key, RECORD))], RECORD


async def test_a_withdrawn_key_is_refused_as_soon_as_the_file_changes_and_no_other_node_notices(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "generations"
    path.write_text("# none withdrawn yet\n")
    identity = AgentIdentity(master_key=MASTER, generations=KeyGenerations(path, recheck_s=0.0))
    old, other = node_key(MASTER, "gpu-7"), node_key(MASTER, "gpu-8")
    assert await identity.refusals([signed("gpu-7", old), signed("gpu-8", other)]) == [None, None]

    path.write_text("gpu-7 2\n")  # gpu-7's key file was copied: withdrawn
    refused, kept = await identity.refusals([signed("gpu-7", old), signed("gpu-8", other)])
    assert refused is not None and "node 'gpu-7''s key of generation 2: a withdrawn key" in refused
    assert kept is None
    assert await identity.refusals([signed("gpu-7", node_key(MASTER, "gpu-7", 2))]) == [None]

    path.write_text("gpu-7 two\n")  # a bad edit: logged, and the last good generations stand
    with caplog.at_level(logging.ERROR):
        again = await identity.refusals([signed("gpu-7", old)])
        assert again[0] is not None and "generation 2" in again[0]
        assert await identity.refusals([signed("gpu-7", old)]) == again
    (told,) = [record for record in caplog.records if "the last good ones stand" in record.getMessage()]  # once
    assert "got 'two'" in told.reason  # type: ignore[attr-defined]
    assert identity.describe()["withdrawn_node_keys"] == 1


def test_a_bad_generations_file_at_start_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE: .*No such file"):
        KeyGenerations(tmp_path / "missing")
    (tmp_path / "bad").write_text("gpu-7 0\n")
    with pytest.raises(ConfigError, match="line 1: generation of 'gpu-7' must be a whole number"):
        KeyGenerations(tmp_path / "bad")
    with pytest.raises(ConfigError, match="KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE: set with"):
        AgentIdentity.settings_from_env({"KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE": str(tmp_path / "bad")})
