"""Which node an agent may speak for: the node its own pod runs on, as the Kubernetes API says.

With agents' tokens required (`KUMIKI_TELEMETRY_AGENT_AUDIENCE`), every sample and inventory carries its agent's
projected ServiceAccount token in the `kumiki-agent-token` header. The adapter asks the API server whose token
it is (`kumiki.common.kube_tokens`); here that answer is held against what the record claims. A record is
taken only when the token is bound to a pod of an agent service account running on the node the record names,
so an agent's Kafka credentials alone (which every node holds) no longer let one node speak for another.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

AGENT_TOKEN_HEADER = "kumiki-agent-token"  # the agent's side: kumiki.agent.adapters.kafka

AUDIENCE_VARIABLE = "KUMIKI_TELEMETRY_AGENT_AUDIENCE"
ACCOUNTS_VARIABLE = "KUMIKI_TELEMETRY_AGENT_ACCOUNTS"


@dataclass(frozen=True, slots=True)
class AgentProof:
    """What the API server said about one token: its pod, when it vouched for one, else why not."""

    pod: str = ""  # namespace/name
    account: str = ""  # namespace/name of the pod's service account
    node: str = ""  # where the pod runs; "" while unscheduled
    refusal: str = ""  # set when the API server did not vouch for a pod


def agent_refusal(node: str, proof: AgentProof | None, accounts: Collection[str]) -> str | None:
    """The dead-letter reason for a record naming `node` that carries `proof` (None: no token), else None."""
    if proof is None:
        return (
            f"{AGENT_TOKEN_HEADER}: missing: node {node!r}'s records must carry its agent's token"
            f" (the agent's --token-file)"
        )
    if proof.refusal:
        return f"{AGENT_TOKEN_HEADER}: {proof.refusal}"
    if proof.account not in accounts:
        return (
            f"{AGENT_TOKEN_HEADER}: pod {proof.pod} runs as service account {proof.account}, which is not an"
            f" agent's ({ACCOUNTS_VARIABLE}: {', '.join(sorted(accounts))})"
        )
    if proof.node != node:
        where = f"on node {proof.node!r}" if proof.node else "on no node yet"
        return f"node: {node!r} is not the node of the agent that sent it (pod {proof.pod} runs {where})"
    return None


def parse_accounts(text: str) -> frozenset[str]:
    """`namespace/name` service accounts, comma separated; ValueError names the entry that is not one."""
    accounts = set()
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        namespace, slash, name = entry.partition("/")
        if not slash or not namespace or not name or "/" in name or any(c.isspace() for c in entry):
            raise ValueError(f"{ACCOUNTS_VARIABLE}: {entry!r} is not namespace/name")
        accounts.add(entry)
    if not accounts:
        raise ValueError(f"{ACCOUNTS_VARIABLE}: name the agents' service accounts (namespace/name, comma separated)")
    return frozenset(accounts)
