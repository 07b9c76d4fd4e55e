"""Stage 1's check that a sample or inventory comes from the agent of the node it names.

Off unless `KUMIKI_TELEMETRY_AGENT_AUDIENCE` is set (the chart sets it from
`services.telemetryIngest.agentTokens.audience`); then `KUMIKI_TELEMETRY_AGENT_ACCOUNTS` names the agents'
service accounts. Each distinct token in a batch is looked up once (`kumiki.common.kube_tokens`): a token not seen
before is reviewed while its batch waits; afterwards its answer is renewed every `CACHE_S` in the background and
stands through an API outage, so a batch never waits on the API server for an agent it knows. What decides is
`core.agent_refusal`, once per (token, node) in the batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kumiki.common.config import ConfigError, Environ
from kumiki.common.kube_tokens import (
    Answer,
    PodToken,
    PodTokenReviewer,
    api_client_from_env,
    audience_from_env,
)
from kumiki.telemetry import core

CACHE_S = 300.0  # agents present the same token on every record; the kubelet rotates it about hourly

Headers = Sequence[tuple[str, bytes]]


def token_of(headers: Headers) -> bytes | None:
    """The record's agent token (the last one, as parse_headers keeps the last of a repeated header)."""
    if headers and headers[-1][0] == core.AGENT_TOKEN_HEADER:  # where the agent puts it
        return headers[-1][1]
    found = None
    for name, value in headers:
        if name == core.AGENT_TOKEN_HEADER:
            found = value
    return found


def proof_of(token: PodToken) -> core.AgentProof:
    if token.answer is not Answer.BOUND_POD:
        return core.AgentProof(pod=token.pod, refusal=token.reason)
    return core.AgentProof(pod=token.pod, account=token.account, node=token.node)


class AgentTokens:
    """Reviews the agents' tokens of a batch; `refusals` says which records to dead-letter and why."""

    def __init__(self, reviewer: PodTokenReviewer, accounts: frozenset[str]) -> None:
        self.reviewer = reviewer
        self.accounts = accounts

    @staticmethod
    def settings_from_env(env: Environ) -> tuple[str, frozenset[str]] | None:
        """(audience, agents' accounts), None when tokens are not required; ConfigError names the variable."""
        audience = audience_from_env(env, core.AUDIENCE_VARIABLE)
        if not audience:
            if env.get(core.ACCOUNTS_VARIABLE, "").strip():
                raise ConfigError(f"{core.ACCOUNTS_VARIABLE}: set with {core.AUDIENCE_VARIABLE}, not alone")
            return None
        try:
            return audience, core.parse_accounts(env.get(core.ACCOUNTS_VARIABLE, ""))
        except ValueError as error:
            raise ConfigError(str(error)) from None

    @classmethod
    def from_env(cls, env: Environ) -> AgentTokens | None:
        settings = cls.settings_from_env(env)
        if settings is None:
            return None
        audience, accounts = settings
        client = api_client_from_env(env, core.AUDIENCE_VARIABLE)
        return cls(PodTokenReviewer(client, audience, cache_s=CACHE_S, revalidate_in_background=True), accounts)

    async def close(self) -> None:
        await self.reviewer.close()

    async def refusals(self, claims: Sequence[tuple[str, Headers]]) -> list[str | None]:
        """For each (node named, record headers): the dead-letter reason, or None to take the record."""
        pairs = [(token_of(headers), node) for node, headers in claims]
        proofs: dict[bytes, core.AgentProof] = {}
        unknown = []
        for token in {token for token, _ in pairs if token is not None}:
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
        decided = {
            (token, node): core.agent_refusal(node, None if token is None else proofs[token], self.accounts)
            for token, node in set(pairs)
        }
        return [decided[pair] for pair in pairs]


def _text(token: bytes) -> str | None:
    try:
        return token.decode("ascii")
    except UnicodeDecodeError:
        return None
