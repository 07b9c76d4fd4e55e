"""A real Kubernetes control plane on loopback for tests, benchmarks and `kumiki up --kubernetes`:
etcd v3.7.0, kube-apiserver v1.37.2, KWOK v0.8.0 (fake kubelets: annotated nodes turn Ready, bound pods run
and end by stages) and, when asked, kube-scheduler v1.37.2, all built from the Go module proxy by
infra/kube/build.sh and cached under ~/.cache/kumiki.

    stack = start_kube(folder)            # etcd + API server + KWOK on free ports, admin token, kubeconfig
    stack.api_url, stack.token, stack.kubeconfig, stack.binaries
    stop_kube(stack)                      # or stop_kube_folder(folder) from another process (kube.json)

No controller-manager runs: there is no garbage collector and no namespace controller (deleting a namespace
leaves it Terminating), and the ServiceAccount admission plugin is off, so pods need no service account.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kumiki.devstack.processes import StackError, alive, free_port, spawn, terminate

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "infra" / "kube" / "build.sh"
KUMIKI_STAGES = REPO_ROOT / "infra" / "kube" / "stages"
CHART_CRDS = REPO_ROOT / "charts" / "kumiki" / "crds"  # what `helm install` applies first: the PodGroup CRD
K8S_VERSION = "v1.37.2"
DEFAULT_HOME = Path.home() / ".cache" / "kumiki" / f"kube-{K8S_VERSION}"
STATE_FILE = "kube.json"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # value "fake": KWOK manages the node


class KubeUnavailable(StackError):
    """The Kubernetes binaries are not built (and building was not asked for, or failed)."""


@dataclass(frozen=True)
class KubeBinaries:
    apiserver: Path
    scheduler: Path
    etcd: Path
    kwok: Path
    stages: Path  # KWOK's own stage files (node-initialize, node-heartbeat, pod-ready, pod-complete, pod-delete)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KubeBinaries:
        """KUMIKI_KUBE_APISERVER, KUMIKI_KUBE_SCHEDULER, KUMIKI_ETCD, KUMIKI_KWOK, KUMIKI_KWOK_STAGES (what
        build.sh prints), else the build cache (KUMIKI_KUBE_HOME or ~/.cache/kumiki/kube-v1.37.2)."""
        env = dict(os.environ) if env is None else env
        home = Path(env.get("KUMIKI_KUBE_HOME") or DEFAULT_HOME)
        return cls(
            apiserver=Path(env.get("KUMIKI_KUBE_APISERVER") or home / "bin" / "kube-apiserver"),
            scheduler=Path(env.get("KUMIKI_KUBE_SCHEDULER") or home / "bin" / "kube-scheduler"),
            etcd=Path(env.get("KUMIKI_ETCD") or home / "bin" / "etcd"),
            kwok=Path(env.get("KUMIKI_KWOK") or home / "bin" / "kwok"),
            stages=Path(env.get("KUMIKI_KWOK_STAGES") or home / "stages"),
        )

    def missing(self) -> list[str]:
        out = [
            str(path) for path in (self.apiserver, self.scheduler, self.etcd, self.kwok) if not os.access(path, os.X_OK)
        ]
        if not (self.stages / "pod-ready.yaml").is_file():
            out.append(str(self.stages / "pod-ready.yaml"))
        return out


def find_binaries(build: bool = False, timeout_s: float = 3600) -> KubeBinaries:
    """The built binaries; with `build`, run infra/kube/build.sh first (seconds when cached, ~15 min cold)."""
    binaries = KubeBinaries.from_env()
    if not binaries.missing():
        return binaries
    if not build:
        raise KubeUnavailable(
            f"Kubernetes binaries not built ({', '.join(binaries.missing())}); run bash {BUILD_SCRIPT}"
        )
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise KubeUnavailable(f"{BUILD_SCRIPT} failed: {result.stderr.strip()[-2000:]}")
    for line in result.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            name, _, value = line[len("export ") :].partition("=")
            os.environ[name] = value
    binaries = KubeBinaries.from_env()
    if binaries.missing():
        raise KubeUnavailable(f"{BUILD_SCRIPT} ran but these are missing: {', '.join(binaries.missing())}")
    return binaries


@dataclass
class KubeStack:
    """A running control plane; `pids` by component (etcd, apiserver, kwok, scheduler)."""

    folder: Path
    api_url: str
    token: str
    kubeconfig: Path
    ca_file: Path
    binaries: KubeBinaries
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def save(self) -> None:
        data = asdict(self)
        data = json.loads(json.dumps(data, default=str))
        (self.folder / STATE_FILE).write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, folder: Path) -> KubeStack:
        data = json.loads((folder / STATE_FILE).read_text())
        binaries = KubeBinaries(**{key: Path(value) for key, value in data["binaries"].items()})
        return cls(
            folder=Path(data["folder"]),
            api_url=data["api_url"],
            token=data["token"],
            kubeconfig=Path(data["kubeconfig"]),
            ca_file=Path(data["ca_file"]),
            binaries=binaries,
            pids={key: int(value) for key, value in data["pids"].items()},
            ports={key: int(value) for key, value in data["ports"].items()},
        )

    def log(self, component: str) -> Path:
        return self.folder / "logs" / f"{component}.log"

    def env(self) -> dict[str, str]:
        """What a binder (or kubectl) in this stack's environment reads."""
        return {"KUMIKI_KUBECONFIG": str(self.kubeconfig), "KUBECONFIG": str(self.kubeconfig)}


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise StackError(
            "the Kubernetes stack needs openssl for its service-account key pair (apt-get install openssl)"
        )
    subprocess.run([openssl, *args], check=True, capture_output=True)


def _get(url: str, token: str, timeout_s: float = 2.0) -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the API server's self-signed serving certificate, on loopback
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def _wait(what: str, check, timeout_s: float, pid: int, log_path: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        if not alive(pid):
            raise StackError(f"{what} exited during start-up; see {log_path}: {_tail(log_path)}")
        time.sleep(0.2)
    raise StackError(f"{what} not ready within {timeout_s:.0f}s; see {log_path}: {_tail(log_path)}")


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _kubeconfig(server: str, token: str) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kumiki", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "kumiki", "context": {"cluster": "kumiki", "user": "admin"}}],
            "current-context": "kumiki",
        },
        indent=2,
    )


def _kwok_config(binaries: KubeBinaries, folder: Path) -> Path:
    """KWOK's module stages plus Kumiki's own (infra/kube/stages), one multi-document file."""
    documents = [path.read_text() for path in sorted(binaries.stages.glob("*.yaml"))]
    documents += [path.read_text() for path in sorted(KUMIKI_STAGES.glob("*.yaml"))]
    path = folder / "kwok-stages.yaml"
    path.write_text("\n---\n".join(document.strip() for document in documents) + "\n")
    return path


def start_kube(
    folder: Path,
    *,
    binaries: KubeBinaries | None = None,
    build: bool = False,
    kwok: bool = True,
    scheduler: bool = False,
    timeout_s: float = 90.0,
) -> KubeStack:
    """etcd, kube-apiserver and (by default) KWOK in `folder`, on free loopback ports; ready when /readyz is."""
    binaries = binaries or find_binaries(build=build)
    missing = binaries.missing()
    if missing:
        raise KubeUnavailable(f"Kubernetes binaries not built ({', '.join(missing)}); run bash {BUILD_SCRIPT}")
    folder = folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    pki = folder / "pki"
    pki.mkdir(exist_ok=True)
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    token_file = pki / "tokens.csv"
    if token_file.exists():
        token = token_file.read_text().split(",", 1)[0]
    else:
        token = uuid.uuid4().hex  # a random development token, written only into this folder
        token_file.write_text(f'{token},kumiki-admin,kumiki-admin,"system:masters"\n')
        token_file.chmod(0o600)
    ports = {"etcd": free_port(), "etcd_peer": free_port(), "apiserver": free_port()}
    stack = KubeStack(
        folder=folder,
        api_url=f"https://127.0.0.1:{ports['apiserver']}",
        token=token,
        kubeconfig=folder / "kubeconfig",
        ca_file=folder / "certs" / "apiserver.crt",
        binaries=binaries,
        ports=ports,
    )
    stack.kubeconfig.write_text(_kubeconfig(stack.api_url, token))
    stack.kubeconfig.chmod(0o600)
    try:
        etcd_url = f"http://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
        stack.pids["etcd"] = spawn(
            [
                str(binaries.etcd),
                "--name=kumiki",
                f"--data-dir={folder / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kumiki={peer_url}",
                "--unsafe-no-fsync",  # development only: nothing here outlives a test
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
            stack.log("etcd"),
        )
        stack.save()
        _wait(
            "etcd",
            lambda: urllib.request.urlopen(f"{etcd_url}/health", timeout=1).status == 200,
            timeout_s,
            stack.pids["etcd"],
            stack.log("etcd"),
        )
        stack.pids["apiserver"] = spawn(
            [
                str(binaries.apiserver),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={folder / 'certs'}",
                f"--token-auth-file={token_file}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--endpoint-reconciler-type=none",  # else it exits: 127.0.0.1 cannot be a service endpoint
                # no controller-manager runs: nothing makes default service accounts, and nothing would lift
                # the not-ready taint TaintNodesByCondition puts on every new node (kube-scheduler honours it)
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                "--max-requests-inflight=2000",
                "--max-mutating-requests-inflight=1000",
                "--profiling=false",
                "--v=1",
            ],
            stack.log("apiserver"),
        )
        stack.save()
        _wait(
            "kube-apiserver",
            lambda: _get(f"{stack.api_url}/readyz", token)[0] == 200,
            timeout_s,
            stack.pids["apiserver"],
            stack.log("apiserver"),
        )
        if kwok:
            start_kwok(stack)
        if scheduler:
            start_scheduler(stack)
    except BaseException:
        stop_kube(stack)
        raise
    stack.save()
    return stack


def start_kwok(stack: KubeStack) -> int:
    """KWOK managing every node annotated kwok.x-k8s.io/node=fake."""
    stack.ports["kwok"] = free_port()
    config = _kwok_config(stack.binaries, stack.folder)
    stack.pids["kwok"] = spawn(
        [
            str(stack.binaries.kwok),
            f"--kubeconfig={stack.kubeconfig}",
            f"--config={config}",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
            "--cidr=10.0.0.1/16",
            "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{stack.ports['kwok']}",
            "--node-lease-duration-seconds=40",
        ],
        stack.log("kwok"),
    )
    stack.save()
    _wait(
        "kwok",
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{stack.ports['kwok']}/healthz", timeout=1).status == 200,
        60,
        stack.pids["kwok"],
        stack.log("kwok"),
    )
    return stack.pids["kwok"]


def start_scheduler(stack: KubeStack, extra_args: tuple[str, ...] = ()) -> int:
    """kube-scheduler with its default profile (the baseline), no leader election."""
    stack.ports["scheduler"] = free_port()
    stack.pids["scheduler"] = spawn(
        [
            str(stack.binaries.scheduler),
            f"--kubeconfig={stack.kubeconfig}",
            f"--authentication-kubeconfig={stack.kubeconfig}",
            f"--authorization-kubeconfig={stack.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={stack.ports['scheduler']}",
            "--v=1",
            *extra_args,
        ],
        stack.log("scheduler"),
    )
    stack.save()

    def healthy() -> bool:
        status, _ = _get(f"https://127.0.0.1:{stack.ports['scheduler']}/healthz", stack.token)
        return status == 200

    _wait("kube-scheduler", healthy, 60, stack.pids["scheduler"], stack.log("scheduler"))
    return stack.pids["scheduler"]


def install_crds(stack: KubeStack, timeout_s: float = 60.0) -> list[str]:
    """The chart's CRDs, applied server-side as Helm would, and waited for until the API serves them (the
    binder reads PodGroups only if it finds them served at its start)."""
    import asyncio

    from lightkube import AsyncClient, KubeConfig
    from lightkube.codecs import load_all_yaml
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    async def apply() -> list[str]:
        client = AsyncClient(config=KubeConfig.from_file(str(stack.kubeconfig)), field_manager="kumiki-devstack")
        names = []
        try:
            for path in sorted(CHART_CRDS.glob("*.yaml")):
                for obj in load_all_yaml(path.read_text()):
                    await client.apply(obj, force=True)
                    assert obj.metadata is not None and obj.metadata.name is not None
                    names.append(obj.metadata.name)
            deadline = time.monotonic() + timeout_s
            for name in names:
                while True:
                    crd = await client.get(CustomResourceDefinition, name)
                    conditions = (crd.status.conditions if crd.status else None) or []
                    if any(c.type == "Established" and c.status == "True" for c in conditions):
                        break
                    if time.monotonic() > deadline:
                        raise KubeUnavailable(f"CRD {name} not established within {timeout_s:.0f}s")
                    await asyncio.sleep(0.2)
        finally:
            await client.close()
        return names

    return asyncio.run(apply())


def stop_component(stack: KubeStack, name: str) -> None:
    pid = stack.pids.pop(name, None)
    terminate(pid, timeout_s=10)
    stack.save()


def stop_kube(stack: KubeStack) -> None:
    """Stop every component, the clients first and etcd last."""
    for name in ("scheduler", "kwok", "apiserver", "etcd"):
        terminate(stack.pids.pop(name, None), timeout_s=10)
    if stack.folder.exists():
        stack.save()


def kube_running(folder: Path) -> KubeStack | None:
    """The stack recorded in `folder` when its API server still runs."""
    if not (folder / STATE_FILE).exists():
        return None
    stack = KubeStack.load(folder)
    return stack if alive(stack.pids.get("apiserver")) else None


def stop_kube_folder(folder: Path) -> bool:
    """Stop the stack recorded in `folder`/kube.json; False when there is none."""
    if not (folder / STATE_FILE).exists():
        return False
    stack = KubeStack.load(folder)
    running = any(alive(pid) for pid in stack.pids.values())
    stop_kube(stack)
    return running


def main(argv: list[str] | None = None) -> int:
    """`python -m kumiki.devstack.kube serve FOLDER [--scheduler]`: the control plane in the foreground (Tilt's
    serve_cmd), stopped on SIGTERM or Ctrl-C; `status FOLDER` exits 0 when its API server is ready."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(prog="python -m kumiki.devstack.kube")
    parser.add_argument("action", choices=("serve", "status"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--scheduler", action="store_true", help="also run kube-scheduler (default profile)")
    args = parser.parse_args(argv)
    if args.action == "status":
        stack = kube_running(args.folder)
        return 0 if stack is not None and _get(f"{stack.api_url}/readyz", stack.token)[0] == 200 else 1
    stack = start_kube(args.folder, build=True, scheduler=args.scheduler)
    print(f"Kubernetes API {stack.api_url}; export KUBECONFIG={stack.kubeconfig}", flush=True)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping:
            if not all(alive(pid) for pid in stack.pids.values()):
                print(f"a component exited; see {stack.folder / 'logs'}", flush=True)
                return 1
            time.sleep(1.0)
    finally:
        stop_kube(stack)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
