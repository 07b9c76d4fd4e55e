"""With agents' proofs required, telemetry takes a node's samples and inventory only from that node's own agent.

Real parts throughout. Tokens: a kube-apiserver (v1.37.2) holds the agents' pods on their nodes and reviews their
tokens (TokenReview), minted the way the kubelet mints a projected volume's (TokenRequest bound to the pod), and
telemetry reviews as a service account holding only the chart's two rules. Keys: each node's key printed by
`kumiki telemetry node-key`. Telemetry runs as a process on Apache Kafka; each agent is a `python -m
kumiki.agent` process on the fake libnvidia-ml.so.1 sending its `--token-file` or `--node-key-file`.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Namespace, Node, Pod, ServiceAccount

from kumiki.common.bus import ensure_topics
from kumiki.common.bus.topics import ALL_TOPICS
from kumiki.common.config import KafkaSettings
from kumiki.devstack.processes import free_port
from kumiki.telemetry.core import AGENT_SIGNATURE_HEADER, AGENT_TOKEN_HEADER, missing_proof
from tests.agent.fake_nvml.build import FakeNvmlConfig
from tests.binder.support import node_object, pod_object, pod_token, reviewer_kubeconfig
from tests.conftest import wait_until
from tests.telemetry.support import IDLE_GPU, OTHER_GPU, Processes, Topics, node_a, node_b, ready, service_env

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
AUDIENCE = "kumiki-telemetry"


@dataclass
class Fleet:
    namespace: str
    tokens: dict[str, str]  # pod name -> its token for AUDIENCE
    kubeconfig: Path  # telemetry's own service account: two rules, nothing else


@pytest.fixture
async def fleet(kube: AsyncClient, kube_stack: Any, tmp_path: Path) -> Fleet:
    run = tmp_path.name[-8:].lower().replace("_", "-").strip("-") or "run"
    namespace = f"agents-{run}"
    await kube.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    for account in ("kumiki-agent", "trainer"):
        await kube.create(ServiceAccount.from_dict({"metadata": {"name": account, "namespace": namespace}}))
    for node in ("node-a", "node-b"):
        await kube.create(Node.from_dict(node_object(node)))
    tokens = {}
    for pod, account, node in (
        ("agent-a", "kumiki-agent", "node-a"),
        ("agent-b", "kumiki-agent", "node-b"),
        ("trainer-b", "trainer", "node-b"),
    ):
        manifest = pod_object(namespace, pod)
        manifest["spec"] |= {"serviceAccountName": account, "nodeName": node}
        created = await kube.create(Pod.from_dict(manifest))
        tokens[pod] = await pod_token(kube, namespace, created, audience=AUDIENCE, account=account)
    kubeconfig = await reviewer_kubeconfig(kube, kube_stack, tmp_path, run, "kumiki-telemetry")
    return Fleet(namespace, tokens, kubeconfig)


def _write_token(path: Path, token: str) -> Path:
    """As the kubelet updates a projected volume: the new file replaces the old one whole."""
    partial = path.with_suffix(".new")
    partial.write_text(token)
    os.replace(partial, path)
    return path


def _start_agent(
    processes: Processes,
    name: str,
    node: str,
    config: FakeNvmlConfig,
    env: dict[str, str],
    token: Path | None,
    option: str = "--token-file",
) -> None:
    folder = Path(env["FAKE_NVML_FOLDER"])
    agent_env = {**env, "LD_LIBRARY_PATH": str(folder), "FAKE_NVML_CONFIG": str(config.write(folder / f"{name}.ini"))}
    argv = ["-m", "kumiki.agent", "--node", node, "--interval-s", "0.2", "--output", "kafka"]
    processes.start(name, argv + ([option, str(token)] if token is not None else []), agent_env)


async def test_each_agent_speaks_only_for_the_node_its_pod_runs_on(
    kafka: KafkaSettings, fleet: Fleet, processes: Processes, fake_nvml_library: Path, tmp_path: Path
) -> None:
    await ensure_topics(kafka, ALL_TOPICS)
    topics = Topics(kafka)
    await topics._consumer.start()
    try:
        http_port = free_port()
        env = service_env(kafka, http_port) | {
            "KUMIKI_TELEMETRY_AGENT_AUDIENCE": AUDIENCE,
            "KUMIKI_TELEMETRY_AGENT_ACCOUNTS": f"{fleet.namespace}/kumiki-agent",
            "KUMIKI_KUBECONFIG": str(fleet.kubeconfig),
            "FAKE_NVML_FOLDER": str(fake_nvml_library),
        }
        processes.start("telemetry", ["-m", "kumiki.telemetry"], env)
        await wait_until(lambda: ready(http_port), timeout_s=60, what=f"telemetry ready\n{processes.log('telemetry')}")

        token_a = _write_token(tmp_path / "agent-a.token", fleet.tokens["agent-a"])
        _start_agent(processes, "agent-a", "node-a", node_a(), env, token_a)  # its own node: taken
        # node-b's records, sent with agent-a's token, with a trainer's token on node-b, and with none at all
        _start_agent(processes, "forger", "node-b", node_b(), env, token_a)
        trainer = _write_token(tmp_path / "trainer-b.token", fleet.tokens["trainer-b"])
        _start_agent(processes, "trainer", "node-b", node_b(), env, trainer)
        _start_agent(processes, "untokened", "node-b", node_b(), env, None)

        expected = {
            "forger": f"node: 'node-b' is not the node of the agent that sent it (pod {fleet.namespace}/agent-a runs"
            " on node 'node-a')",
            "trainer": f"{AGENT_TOKEN_HEADER}: pod {fleet.namespace}/trainer-b runs as service account"
            f" {fleet.namespace}/trainer, which is not an agent's (KUMIKI_TELEMETRY_AGENT_ACCOUNTS:"
            f" {fleet.namespace}/kumiki-agent)",
            "untokened": missing_proof("node-b", tokens=True, keys=False),
        }

        def reasons() -> set[str]:
            return {dead["kumiki_dlq_reason"].decode() for dead in topics.dead}

        async def node_a_taken_and_each_forgery_refused() -> bool:
            await topics.poll()
            state = topics.latest("node-a")
            return (
                state is not None
                and {gpu.uuid for gpu in state.gpus} >= {IDLE_GPU}
                and reasons() >= set(expected.values())
            )

        await wait_until(
            node_a_taken_and_each_forgery_refused,
            timeout_s=180,
            what=f"node-a's state and three refusals\n{reasons()}\n{processes.log('telemetry')}",
        )
        assert reasons() == set(expected.values())  # and nothing of agent-a's own was refused
        assert topics.latest("node-b") is None  # neither node-b's samples nor its inventory were taken
        refused_types = {dead["ce_type"] for dead in topics.dead}
        assert refused_types == {b"dev.kumiki.v1.GpuSample", b"dev.kumiki.v1.NodeState"}
        assert not any(AGENT_TOKEN_HEADER in dead for dead in topics.dead)  # a credential stays off dead letters
        assert not any(gpu.uuid == OTHER_GPU for state in topics.states for gpu in state.gpus)

        # The kubelet rotates agent-a's token file; the agent reads the new one. Here the new token is agent-b's
        # (node-b), so from then on node-a's records are refused: each record carries the file's current token.
        refused_before = len(topics.dead)
        _write_token(token_a, fleet.tokens["agent-b"])
        moved = (
            f"node: 'node-a' is not the node of the agent that sent it (pod {fleet.namespace}/agent-b runs on node"
            " 'node-b')"
        )

        async def node_a_refused() -> bool:
            await topics.poll()
            return any(dead["kumiki_dlq_reason"].decode() == moved for dead in topics.dead[refused_before:])

        await wait_until(node_a_refused, timeout_s=60, what=f"agent-a refused after its token changed\n{reasons()}")
        assert processes.running["telemetry"].poll() is None  # refusals are records' fate, not the service's
    finally:
        await topics._consumer.stop()


async def test_outside_kubernetes_each_agent_signs_for_its_own_node_with_its_key(
    kafka: KafkaSettings, processes: Processes, fake_nvml_library: Path, tmp_path: Path
) -> None:
    await ensure_topics(kafka, ALL_TOPICS)
    topics = Topics(kafka)
    await topics._consumer.start()
    try:
        telemetry_key = tmp_path / "telemetry.key"
        telemetry_key.write_text(secrets.token_hex(32))
        generations = tmp_path / "generations"
        generations.write_text("# <node> <generation>: the nodes whose keys were withdrawn\n")
        http_port = free_port()
        env = service_env(kafka, http_port) | {
            "KUMIKI_TELEMETRY_AGENT_KEY_FILE": str(telemetry_key),
            "KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE": str(generations),
            "FAKE_NVML_FOLDER": str(fake_nvml_library),
        }

        def installed(node: str, name: str) -> Path:
            """What an operator installs on a node: its key as `kumiki telemetry node-key` prints it."""
            printed = subprocess.run(
                [sys.executable, "-m", "kumiki.cli", "telemetry", "node-key", "--node", node],
                env=env, capture_output=True, text=True, check=True, timeout=60,
            )  # fmt: skip
            path = tmp_path / f"{name}.key"
            path.write_text(printed.stdout)
            return path

        keys = {node: installed(node, node) for node in ("node-a", "node-b")}
        processes.start("telemetry", ["-m", "kumiki.telemetry"], env)
        await wait_until(lambda: ready(http_port), timeout_s=60, what=f"telemetry ready\n{processes.log('telemetry')}")
        _start_agent(processes, "agent-a", "node-a", node_a(), env, keys["node-a"], "--node-key-file")
        _start_agent(processes, "forger", "node-b", node_b(), env, keys["node-a"], "--node-key-file")
        _start_agent(processes, "unsigned", "node-b", node_b(), env, None)
        expected = {
            f"{AGENT_SIGNATURE_HEADER}: does not match node 'node-b''s key: signed by another node's agent, or the"
            " record was changed",
            missing_proof("node-b", tokens=False, keys=True),
        }

        def reasons() -> set[str]:
            return {dead["kumiki_dlq_reason"].decode() for dead in topics.dead}

        async def node_a_taken_and_node_b_refused() -> bool:
            await topics.poll()
            state = topics.latest("node-a")
            return state is not None and {gpu.uuid for gpu in state.gpus} >= {IDLE_GPU} and reasons() >= expected

        await wait_until(
            node_a_taken_and_node_b_refused,
            timeout_s=180,
            what=f"node-a's state and two refusals\n{reasons()}\n{processes.log('telemetry')}",
        )
        assert reasons() == expected
        assert topics.latest("node-b") is None
        # node-b's own agent, with its own key, is taken from then on
        _start_agent(processes, "agent-b", "node-b", node_b(), env, keys["node-b"], "--node-key-file")

        async def node_b_taken() -> bool:
            await topics.poll()
            state = topics.latest("node-b")
            return state is not None and [gpu.uuid for gpu in state.gpus] == [OTHER_GPU]

        await wait_until(node_b_taken, timeout_s=120, what=f"node-b's state\n{processes.log('agent-b')}")

        # node-b's key file was copied: the operator withdraws that key alone, without restarting telemetry
        generations.write_text("node-b 2\n")
        withdrawn = (
            f"{AGENT_SIGNATURE_HEADER}: does not match node 'node-b''s key of generation 2: a withdrawn key, signed"
            " by another node's agent, or the record was changed"
        )

        async def old_key_refused() -> bool:
            await topics.poll()
            state = topics.latest("node-b")
            return withdrawn in reasons() and state is not None and not state.healthy  # silent: stale

        await wait_until(old_key_refused, timeout_s=120, what=f"the old key refused\n{reasons()}")
        _start_agent(processes, "agent-b2", "node-b", node_b(), env, installed("node-b", "node-b2"), "--node-key-file")
        await wait_until(lambda: _healthy_again(topics, "node-b"), timeout_s=120, what=f"node-b's new key\n{reasons()}")
        latest_a = topics.latest("node-a")
        assert latest_a is not None and latest_a.healthy  # node-a's key never changed
        assert processes.running["telemetry"].poll() is None
    finally:
        await topics._consumer.stop()


async def _healthy_again(topics: Topics, node: str) -> bool:
    await topics.poll()
    state = topics.latest(node)
    return state is not None and state.healthy and [gpu.uuid for gpu in state.gpus] == [OTHER_GPU]
