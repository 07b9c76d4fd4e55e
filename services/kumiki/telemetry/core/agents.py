"""Which node an agent may speak for: its own, proven one of two ways.

- On Kubernetes (`KUMIKI_TELEMETRY_AGENT_AUDIENCE`), every sample and inventory carries its agent pod's
  projected ServiceAccount token in the `kumiki-agent-token` header. The adapter asks the API server whose
  token it is (`kumiki.common.kube_tokens`); `agent_refusal` holds that answer against what the record claims:
  a pod of an agent service account running on the node the record names.
- Outside Kubernetes (`KUMIKI_TELEMETRY_AGENT_KEY_FILE`), each node's agent holds its own key, derived from
  telemetry's key and the node's name (`node_key`), and signs every record's bytes (`kumiki-agent-signature`,
  HMAC-SHA256). `signature_refusal` derives the key of the node the record names and checks the signature, so
  one node's key signs for that node only. A node's key is withdrawn alone by moving it to its next generation
  (`KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE`, `parse_generations`).

Either way an agent's Kafka credentials alone (which every node holds) no longer let one node speak for another.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection
from dataclasses import dataclass

AGENT_TOKEN_HEADER = "kumiki-agent-token"  # the agent's side: kumiki.agent.adapters.kafka
AGENT_SIGNATURE_HEADER = "kumiki-agent-signature"
AUDIENCE_VARIABLE = "KUMIKI_TELEMETRY_AGENT_AUDIENCE"
ACCOUNTS_VARIABLE = "KUMIKI_TELEMETRY_AGENT_ACCOUNTS"
KEY_VARIABLE = "KUMIKI_TELEMETRY_AGENT_KEY_FILE"
GENERATIONS_VARIABLE = "KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE"
MAX_GENERATION = 1_000_000
_NODE_KEY_CONTEXT = b"kumiki-agent-node\x00"  # keys for other purposes never equal a node's


@dataclass(frozen=True, slots=True)
class AgentProof:
    """What the API server said about one token: its pod, when it vouched for one, else why not."""

    pod: str = ""  # namespace/name
    account: str = ""  # namespace/name of the pod's service account
    node: str = ""  # where the pod runs; "" while unscheduled
    refusal: str = ""  # set when the API server did not vouch for a pod


def missing_proof(node: str, tokens: bool, keys: bool) -> str:
    """The dead-letter reason for a record that carries neither proof telemetry takes."""
    ways = [*(["its agent's token (the agent's --token-file)"] if tokens else []),
            *(["its agent's signature (the agent's --node-key-file)"] if keys else [])]  # fmt: skip
    header = AGENT_TOKEN_HEADER if tokens else AGENT_SIGNATURE_HEADER
    return f"{header}: missing: node {node!r}'s records must carry {' or '.join(ways)}"


def agent_refusal(node: str, proof: AgentProof | None, accounts: Collection[str]) -> str | None:
    """The dead-letter reason for a record naming `node` that carries `proof` (None: no token), else None."""
    if proof is None:
        return missing_proof(node, tokens=True, keys=False)
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


def node_key(master: bytes, node: str, generation: int = 0) -> bytes:
    """The key of one node's agent (hex, ASCII): HMAC-SHA256 of the node's name (and its key generation, from 1)
    under telemetry's key. Whoever holds it can sign for that node and no other; `kumiki telemetry node-key`
    prints it for an operator. A node's next generation withdraws its key alone (`parse_generations`)."""
    suffix = b"\x00" + str(generation).encode() if generation else b""
    return hmac.new(master, _NODE_KEY_CONTEXT + node.encode() + suffix, hashlib.sha256).hexdigest().encode()


def parse_generations(text: str, where: str = GENERATIONS_VARIABLE) -> dict[str, int]:
    """Node key generations: a line `<node> <generation>` per node whose key was withdrawn (generation >= 1; a
    node not listed is at 0), `#` comments and blank lines ignored. ValueError names the line."""
    generations: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        at = f"{where}: line {number}"
        if len(words) != 2:
            raise ValueError(f"{at}: expected '<node> <generation>', got {line.strip()!r}")
        node, raw = words
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_GENERATION:
            raise ValueError(
                f"{at}: generation of {node!r} must be a whole number in [1, {MAX_GENERATION}], got {raw!r}"
            )
        if node in generations:
            raise ValueError(f"{at}: node {node!r} is listed twice")
        generations[node] = int(raw)
    return generations


def signature(key: bytes, value: bytes) -> bytes:
    """What an agent puts in `kumiki-agent-signature`: HMAC-SHA256 of the record's bytes, in hex."""
    return hmac.new(key, value, hashlib.sha256).hexdigest().encode()


def signature_refusal(node: str, value: bytes, signed: bytes, key: bytes, generation: int = 0) -> str | None:
    """The dead-letter reason for a record naming `node` whose bytes `value` carry `signed`, else None; `key`:
    that node's key (`node_key`) at `generation`."""
    if hmac.compare_digest(signed, signature(key, value)):
        return None
    if generation:
        return (
            f"{AGENT_SIGNATURE_HEADER}: does not match node {node!r}'s key of generation {generation}: a withdrawn"
            " key, signed by another node's agent, or the record was changed"
        )
    return (
        f"{AGENT_SIGNATURE_HEADER}: does not match node {node!r}'s key: signed by another node's agent, or the"
        " record was changed"
    )
