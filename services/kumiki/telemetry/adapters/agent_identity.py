"""Stage 1's check that a sample or inventory comes from the agent of the node it names.

Off unless telemetry is told how agents prove their node (docs/telemetry.md, "Agents' identity"):
- `KUMIKI_TELEMETRY_AGENT_AUDIENCE` (the chart's `services.telemetryIngest.agentTokens.audience`) with
  `KUMIKI_TELEMETRY_AGENT_ACCOUNTS`: agent pods' projected ServiceAccount tokens. Each distinct token in a batch
  is looked up once (`kumiki.common.kube_tokens`): a token not seen before is reviewed while its batch waits;
  afterwards its answer is renewed every `CACHE_S` in the background and stands through an API outage, so a
  batch never waits on the API server for an agent it knows.
- `KUMIKI_TELEMETRY_AGENT_KEY_FILE`: telemetry's key, from which each node's agent key is derived (agents outside
  Kubernetes); a record's signature is checked against the key of the node it names, derived once per node.
  `KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE` lists the nodes whose keys were withdrawn, at their next
  generation; it is looked at every `GENERATIONS_RECHECK_S` and a change takes effect without a restart (a bad
  edit is logged and the last good list kept).
Both may be on; a record is judged by the proof it carries. The decisions are `core.agent_refusal` (once per
token and node in a batch) and `core.signature_refusal`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from kumiki.common.config import ConfigError, Environ, env_key
from kumiki.common.kube_tokens import (
    Answer,
    PodToken,
    PodTokenReviewer,
    api_client_from_env,
    audience_from_env,
)
from kumiki.common.token_file import WatchedFile
from kumiki.telemetry import core

log = logging.getLogger(__name__)

CACHE_S = 300.0  # agents present the same token on every record; the kubelet rotates it about hourly
NODE_KEYS_KEPT = 100_000  # derived node keys kept (a record naming nodes at random cannot grow it without end)
GENERATIONS_RECHECK_S = 5.0  # a withdrawn key stops verifying within this long of the file's change

Headers = Sequence[tuple[str, bytes]]
Claim = tuple[str, Headers, bytes]  # the node a record names, its headers, its bytes


def header(headers: Headers, name: str) -> bytes | None:
    """A record's header (the last one, as parse_headers keeps the last of a repeated header)."""
    if headers and headers[-1][0] == name:  # where the agent puts its proof
        return headers[-1][1]
    found = None
    for key, value in headers:
        if key == name:
            found = value
    return found


def proof_of(token: PodToken) -> core.AgentProof:
    if token.answer is not Answer.BOUND_POD:
        return core.AgentProof(pod=token.pod, refusal=token.reason)
    return core.AgentProof(pod=token.pod, account=token.account, node=token.node)


class KeyGenerations:
    """The node key generations file, read again when it changes (a ConfigMap the kubelet updates, a file an
    operator edits). Unreadable or malformed at start: ConfigError naming the variable and line. Later: logged,
    and the last good generations stand, so a bad edit never takes the agents' keys away."""

    def __init__(self, path: Path, recheck_s: float = GENERATIONS_RECHECK_S) -> None:
        self.path = path
        self._file = WatchedFile(path, recheck_s=recheck_s)
        self.generations: dict[str, int] = {}
        try:
            self.refresh(force=True)
        except (OSError, ValueError) as error:
            why = error.strerror if isinstance(error, OSError) else str(error)
            raise ConfigError(f"{core.GENERATIONS_VARIABLE}: {str(path)!r}: {why}") from None

    def refresh(self, *, force: bool = False) -> bool:
        """Whether the generations changed (raises only when `force`d, at start)."""
        try:
            found = self._file.read_if_changed(force=force)
            if found is None:
                return False
            text, version = found
            self._file.accept(version)  # a bad edit is told once, not at every look until it is mended
            generations = core.parse_generations(text, str(self.path))
        except (OSError, ValueError) as error:  # an OSError (mid-swap, gone) is looked at again next time
            if force:
                raise
            reason = error.strerror if isinstance(error, OSError) else str(error)
            log.error("node key generations not read; the last good ones stand", extra={"reason": reason})
            return False
        changed = generations != self.generations
        self.generations = generations
        return changed


class AgentIdentity:
    """Judges a batch's records by their agents' proofs; `refusals` says which to dead-letter and why."""

    def __init__(
        self,
        reviewer: PodTokenReviewer | None = None,
        accounts: frozenset[str] = frozenset(),
        master_key: bytes | None = None,
        generations: KeyGenerations | None = None,
    ) -> None:
        self.reviewer = reviewer
        self.accounts = accounts
        self.master_key = master_key
        self.generations = generations
        self._node_keys: dict[str, tuple[bytes, int]] = {}

    @staticmethod
    def settings_from_env(env: Environ) -> tuple[str, frozenset[str], bytes | None, KeyGenerations | None] | None:
        """(audience or "", agents' accounts, telemetry's key or None, the node key generations or None); None
        when neither way is on. ConfigError names the variable."""
        audience = audience_from_env(env, core.AUDIENCE_VARIABLE)
        accounts: frozenset[str] = frozenset()
        if audience:
            try:
                accounts = core.parse_accounts(env.get(core.ACCOUNTS_VARIABLE, ""))
            except ValueError as error:
                raise ConfigError(str(error)) from None
        elif env.get(core.ACCOUNTS_VARIABLE, "").strip():
            raise ConfigError(f"{core.ACCOUNTS_VARIABLE}: set with {core.AUDIENCE_VARIABLE}, not alone")
        key = env_key(env, core.KEY_VARIABLE)
        if env.get(core.GENERATIONS_VARIABLE, "").strip() and key is None:
            raise ConfigError(f"{core.GENERATIONS_VARIABLE}: set with {core.KEY_VARIABLE}, not alone")
        if not audience and key is None:
            return None
        path = env.get(core.GENERATIONS_VARIABLE, "").strip()
        return audience, accounts, key, KeyGenerations(Path(path)) if path else None

    @classmethod
    def from_env(cls, env: Environ) -> AgentIdentity | None:
        settings = cls.settings_from_env(env)
        if settings is None:
            return None
        audience, accounts, key, generations = settings
        reviewer = None
        if audience:
            client = api_client_from_env(env, core.AUDIENCE_VARIABLE)
            reviewer = PodTokenReviewer(client, audience, cache_s=CACHE_S, revalidate_in_background=True)
        return cls(reviewer, accounts, key, generations)

    def describe(self) -> dict[str, object]:
        """What the service logs at start."""
        return {
            "audience": self.reviewer.audience if self.reviewer is not None else None,
            "accounts": sorted(self.accounts),
            "node_keys": self.master_key is not None,
            "withdrawn_node_keys": len(self.generations.generations) if self.generations is not None else 0,
        }

    async def close(self) -> None:
        if self.reviewer is not None:
            await self.reviewer.close()

    async def refusals(self, claims: Sequence[Claim]) -> list[str | None]:
        """For each claim: the dead-letter reason, or None to take the record."""
        reasons: list[str | None] = [None] * len(claims)
        tokened: list[tuple[int, bytes, str]] = []  # (claim index, token, node)
        if self.generations is not None and self.generations.refresh():
            self._node_keys.clear()  # a node moved to its next generation: its old key signs no more
        for index, (node, headers, value) in enumerate(claims):
            signed = header(headers, core.AGENT_SIGNATURE_HEADER) if self.master_key is not None else None
            if signed is not None:
                reasons[index] = self._signature_refusal(node, value, signed)
                continue
            token = header(headers, core.AGENT_TOKEN_HEADER) if self.reviewer is not None else None
            if token is not None:
                tokened.append((index, token, node))
            else:
                reasons[index] = core.missing_proof(node, self.reviewer is not None, self.master_key is not None)
        if tokened:
            proofs = await self._proofs({token for _, token, _ in tokened})
            decided = {
                (token, node): core.agent_refusal(node, proofs[token], self.accounts)
                for token, node in {(token, node) for _, token, node in tokened}
            }
            for index, token, node in tokened:
                reasons[index] = decided[(token, node)]
        return reasons

    def _signature_refusal(self, node: str, value: bytes, signed: bytes) -> str | None:
        assert self.master_key is not None
        derived = self._node_keys.get(node)
        if derived is None:
            if len(self._node_keys) >= NODE_KEYS_KEPT:
                self._node_keys.clear()
            generation = self.generations.generations.get(node, 0) if self.generations is not None else 0
            derived = self._node_keys[node] = (core.node_key(self.master_key, node, generation), generation)
        return core.signature_refusal(node, value, signed, *derived)

    async def _proofs(self, tokens: set[bytes]) -> dict[bytes, core.AgentProof]:
        assert self.reviewer is not None
        proofs: dict[bytes, core.AgentProof] = {}
        unknown = []
        for token in tokens:
            text = _text(token)
            kept = None if text is None else self.reviewer.kept(text)
            if text is None:
                proofs[token] = core.AgentProof(refusal="not a Kubernetes token (not ASCII)")
            elif kept is not None:
                proofs[token] = proof_of(kept)
            else:
                unknown.append((token, text))
        answers = await asyncio.gather(*(self.reviewer.review(text) for _, text in unknown))
        proofs.update((token, proof_of(answer)) for (token, _), answer in zip(unknown, answers, strict=True))
        return proofs


def _text(token: bytes) -> str | None:
    try:
        return token.decode("ascii")
    except UnicodeDecodeError:
        return None
