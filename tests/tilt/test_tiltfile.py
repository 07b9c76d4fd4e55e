"""tilt/Tiltfile evaluated by go.starlark.net (the interpreter Tilt embeds, through the starlark-go wheel)
against stand-ins for the Tilt API that keep Tilt's parameter names, so a misspelt keyword, a syntax error or
an unknown Tilt function fails here. Tilt itself is not run: it cannot be installed on this machine (the Go
module proxy refuses github.com/tilt-dev/tilt and there is no other registry for it).

The commands the Tiltfile builds are then run with a fake `kumiki` and `python` to check that the addresses
`kumiki up --infra-only` prints reach every service process.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TILTFILE = REPO_ROOT / "tilt" / "Tiltfile"

starlark_go = pytest.importorskip("starlark_go", reason="starlark-go (go.starlark.net for Python) is not installed")

# Stand-ins with the keyword names of Tilt's builtins (internal/tiltfile in tilt-dev/tilt). Attribute access
# (os.path.join, config.parse) is rewritten to os_path_join, config_parse: plain Starlark has no modules.
TILT_API = """
CALLS = []
DEFINED = []
TRIGGER_MODE_AUTO = "auto"
TRIGGER_MODE_MANUAL = "manual"

def fail(msg):
    {}["fail: " + msg]

def _call(kind, args):
    CALLS.append(dict(kind = kind, **args))

def local_resource(name, cmd = None, deps = None, trigger_mode = None, resource_deps = None, ignore = None,
                   auto_init = True, serve_cmd = None, cmd_bat = None, serve_cmd_bat = None, allow_parallel = False,
                   links = None, labels = None, tags = None, env = None, serve_env = None, readiness_probe = None,
                   dir = None, serve_dir = None):
    _call("local_resource", dict(name = name, cmd = cmd, deps = deps, trigger_mode = trigger_mode,
                                 resource_deps = resource_deps or [], auto_init = auto_init, serve_cmd = serve_cmd,
                                 links = links or [], labels = labels or [], env = env or {},
                                 serve_env = serve_env or {}, readiness_probe = readiness_probe, dir = dir,
                                 serve_dir = serve_dir))

def probe(initial_delay_secs = 0, timeout_secs = 1, period_secs = 10, success_threshold = 1, failure_threshold = 3,
          exec = None, http_get = None, tcp_socket = None):
    return dict(period_secs = period_secs, timeout_secs = timeout_secs, failure_threshold = failure_threshold,
                exec = exec, http_get = http_get, tcp_socket = tcp_socket)

def exec_action(command):
    return dict(command = command)

def http_get_action(port, host = "localhost", scheme = "http", path = ""):
    return dict(port = port, host = host, scheme = scheme, path = path)

def link(url, name = None):
    return dict(url = url, name = name)

def port_forward(local_port, container_port = None, name = None, link_path = None, host = None):
    return dict(local_port = local_port, container_port = container_port, name = name)

def helm(paths, name = None, namespace = None, values = None, set = None, kube_version = None, skip_crds = False):
    _call("helm", dict(paths = paths, name = name, namespace = namespace, values = values or [], set = set or []))
    return "<helm yaml>"

def k8s_yaml(yaml, allow_duplicates = False):
    _call("k8s_yaml", dict(yaml = yaml))

def k8s_resource(workload = None, new_name = None, port_forwards = None, extra_pod_selectors = None,
                 trigger_mode = None, resource_deps = None, objects = None, auto_init = True, pod_readiness = None,
                 links = None, labels = None, discovery_strategy = None):
    _call("k8s_resource", dict(workload = workload, new_name = new_name, port_forwards = port_forwards or []))

def docker_build(ref, context, build_args = None, dockerfile = None, dockerfile_contents = None, live_update = None,
                 match_in_env_vars = False, ignore = None, only = None, entrypoint = None, target = None,
                 ssh = None, network = None, secret = None, extra_tag = None, container_args = None,
                 cache_from = None, pull = False, platform = None):
    _call("docker_build", dict(ref = ref, context = context, dockerfile = dockerfile, only = only or []))

def allow_k8s_contexts(contexts):
    _call("allow_k8s_contexts", dict(contexts = contexts))

def watch_file(file_path):
    _call("watch_file", dict(path = file_path))

def _define(name, kind):
    if name in [d[0] for d in DEFINED]:
        fail("config: %s defined twice" % name)
    DEFINED.append((name, kind))

def config_define_bool(name, args = False, usage = ""):
    _define(name, "bool")

def config_define_string(name, args = False, usage = ""):
    _define(name, "string")

def config_define_string_list(name, args = False, usage = ""):
    _define(name, "string_list")

def config_parse():
    kinds = dict(DEFINED)
    for name, value in ARGS.items():
        if name not in kinds:
            fail("unknown Tiltfile argument --%s" % name)
        wanted = {"bool": "bool", "string": "string", "string_list": "list"}[kinds[name]]
        if type(value) != wanted:
            fail("--%s: expected %s" % (name, wanted))
    return ARGS

def os_getenv(key, default = None):
    return ENV.get(key, default)

def os_path_join(path, *paths):
    result = path
    for part in paths:
        if part.startswith("/"):
            result = part
        elif result.endswith("/"):
            result = result + part
        else:
            result = result + "/" + part
    return result

def os_path_abspath(path):
    parts = []
    for part in path.split("/"):
        if part == "..":
            parts = parts[:-1]
        elif part not in ("", "."):
            parts.append(part)
    return "/" + "/".join(parts)
"""

MODULE_ACCESS = re.compile(r"\b(os\.path|os|config)\.(\w+)")


def evaluate(root: Path, args: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The Tilt calls the Tiltfile makes, as if it lived in ROOT/tilt (config.main_dir)."""
    source = MODULE_ACCESS.sub(lambda m: f"{m.group(1).replace('.', '_')}_{m.group(2)}", TILTFILE.read_text())
    # The Tiltfile comes first, as the body of one function, so that an error's line number is its line + 1;
    # the stand-ins follow (Starlark resolves module-level names across the whole file).
    body = "".join(f"    {line}" if line.strip() else line for line in source.splitlines(keepends=True))
    interpreter = starlark_go.Starlark(
        globals={"ARGS": args or {}, "ENV": env or {}, "config_main_dir": str(root / "tilt")}
    )
    interpreter.exec(f"def _tiltfile():\n{body}    pass\n{TILT_API}\n_tiltfile()\n", filename=str(TILTFILE))
    calls: list[dict[str, Any]] = interpreter.get("CALLS")
    return calls


def local_resources(calls: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in calls if c["kind"] == "local_resource"}


SERVICE_APPS = {
    "placement": "kumiki.placement",
    "quota": "kumiki.quota",
    "forecast": "kumiki.forecast",
    "preemption": "kumiki.preemption",
    "telemetry-ingest": "kumiki.telemetry",
}


def test_the_dev_stack_is_infra_then_every_service_ready_on_its_readyz() -> None:
    resources = local_resources(evaluate(REPO_ROOT))
    assert set(SERVICE_APPS) <= set(resources)
    infra = resources["infra"]
    assert "up --infra-only" in " ".join(infra["cmd"])
    for name, module in SERVICE_APPS.items():
        resource = resources[name]
        spec = importlib.import_module(f"{module}.app").SPEC
        assert spec.name == name
        prefix = "KUMIKI_" + name.upper().replace("-", "_")
        env = resource["serve_env"]
        # the ports Tilt probes are the ones the process listens on: the ServiceSpec defaults
        assert (int(env[f"{prefix}_GRPC_PORT"]), int(env[f"{prefix}_HTTP_PORT"])) == (spec.grpc_port, spec.http_port)
        http_get = resource["readiness_probe"]["http_get"]
        assert http_get["path"] == "/readyz"
        assert http_get["port"] == spec.http_port
        assert resource["serve_cmd"][-1].endswith(f"-m {module}")
        assert importlib.util.find_spec(module) is not None
        assert "infra" in resource["resource_deps"]
        assert resource["serve_dir"] == str(REPO_ROOT)
        assert any(dep.endswith(f"services/kumiki/{module.split('.')[1]}") for dep in resource["deps"])
        assert all(Path(dep).exists() for dep in resource["deps"])
    assert resources["quota"]["serve_env"]["KUMIKI_QUOTA_ALLOW_ANONYMOUS"] == "true"
    # no cluster is assumed
    assert not any(c["kind"] in ("helm", "k8s_yaml", "k8s_resource") for c in evaluate(REPO_ROOT))


def test_the_k8s_section_deploys_the_chart_and_names_its_workloads() -> None:
    calls = evaluate(REPO_ROOT, {"k8s": True, "values": ["/tmp/mine.yaml"], "namespace": "dev"})
    (helm,) = [c for c in calls if c["kind"] == "helm"]
    assert helm["paths"] == str(REPO_ROOT / "charts" / "kumiki")
    assert helm["name"] == "kumiki" and helm["namespace"] == "dev"
    assert helm["values"] == [str(REPO_ROOT / "tilt" / "values-dev.yaml"), "/tmp/mine.yaml"]
    assert Path(helm["values"][0]).is_file()
    assert [c["yaml"] for c in calls if c["kind"] == "k8s_yaml"] == ["<helm yaml>"]
    workloads = {c["workload"]: c for c in calls if c["kind"] == "k8s_resource"}
    # the chart names its Deployments <release>-<service> and the agent <release>-agent
    assert set(workloads) == {f"kumiki-{name}" for name in SERVICE_APPS} | {"kumiki-agent", "kumiki-binder"}
    for name, module in SERVICE_APPS.items():
        spec = importlib.import_module(f"{module}.app").SPEC
        (forward,) = workloads[f"kumiki-{name}"]["port_forwards"]
        assert forward["container_port"] == spec.http_port
        assert forward["local_port"] != spec.http_port  # the local processes hold those
    assert not [c for c in calls if c["kind"] == "docker_build"]
    built = evaluate(REPO_ROOT, {"k8s": True, "build_image": True})
    (build,) = [c for c in built if c["kind"] == "docker_build"]
    assert build["dockerfile"] == str(REPO_ROOT / "infra" / "image" / "Containerfile")
    assert Path(build["dockerfile"]).is_file()


def test_kubernetes_runs_the_real_control_plane_and_the_binder_after_placement() -> None:
    plain = local_resources(evaluate(REPO_ROOT))
    assert "kube" not in plain and "binder" not in plain
    resources = local_resources(evaluate(REPO_ROOT, {"kubernetes": True}))
    kube, binder = resources["kube"], resources["binder"]
    assert kube["serve_cmd"][-3:-1] == ["kumiki.devstack.kube", "serve"]
    assert kube["readiness_probe"]["exec"]["command"][-2] == "status"
    spec = importlib.import_module("kumiki.binder.app").SPEC
    env = binder["serve_env"]
    assert (int(env["KUMIKI_BINDER_GRPC_PORT"]), int(env["KUMIKI_BINDER_HTTP_PORT"])) == (
        spec.grpc_port,
        spec.http_port,
    )
    assert binder["readiness_probe"]["http_get"]["port"] == spec.http_port
    assert env["KUMIKI_KUBECONFIG"] == os.path.join(kube["serve_cmd"][-1], "kubeconfig")
    placement = importlib.import_module("kumiki.placement.app").SPEC
    assert env["KUMIKI_PLACEMENT_ADDRESS"] == f"127.0.0.1:{placement.grpc_port}"
    assert {"infra", "kube", "placement"} <= set(binder["resource_deps"])
    assert binder["serve_cmd"][-1].endswith("-m kumiki.binder")


def test_bad_tiltfile_arguments_fail_naming_them() -> None:
    with pytest.raises(starlark_go.EvalError, match="--broker"):
        evaluate(REPO_ROOT, {"broker": "tansu"})
    with pytest.raises(starlark_go.EvalError, match="--emulate_nodes"):
        evaluate(REPO_ROOT, {"emulate_nodes": "four"})
    with pytest.raises(starlark_go.EvalError, match="unknown Tiltfile argument --k8z"):
        evaluate(REPO_ROOT, {"k8z": True})


FAKE_KUMIKI = """#!/bin/bash
# stands in for `kumiki up --infra-only`: prints what the real one prints
echo "$@" > "$(dirname "$0")/kumiki.args"
echo "starting the Kumiki stack"
echo "export KUMIKI_KAFKA_BOOTSTRAP=127.0.0.1:19999"
echo "export KUMIKI_DATABASE_URL=postgresql://kumiki@127.0.0.1:55999/kumiki"
"""

FAKE_PYTHON = """#!/bin/bash
# stands in for the service: reports its arguments and environment
exec {real} -c 'import json, os, sys; print(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}))' "$@"
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="the Tiltfile's commands run under bash")
def test_the_addresses_infra_prints_reach_every_service_process(tmp_path: Path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "kumiki").write_text(FAKE_KUMIKI)
    (venv / "python").write_text(FAKE_PYTHON.format(real=shutil.which("python3")))
    for tool in ("kumiki", "python"):
        (venv / tool).chmod(0o755)
    (tmp_path / "tilt").mkdir()
    resources = local_resources(evaluate(tmp_path, {"broker": "kafka"}, {"KUMIKI_VENV": str(venv.parent)}))
    infra = resources["infra"]
    subprocess.run(infra["cmd"], cwd=infra["dir"], check=True, capture_output=True, timeout=30)
    assert (venv / "kumiki.args").read_text().split() == [
        "up",
        "--infra-only",
        "--broker",
        "kafka",
        "--emulate-nodes",
        "4",
    ]
    for name, module in SERVICE_APPS.items():
        resource = resources[name]
        env = {**os.environ, **resource["serve_env"]}
        result = subprocess.run(
            resource["serve_cmd"],
            cwd=resource["serve_dir"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        seen = json.loads(result.stdout)
        assert seen["argv"] == ["-m", module]
        assert seen["env"]["KUMIKI_KAFKA_BOOTSTRAP"] == "127.0.0.1:19999"
        assert seen["env"]["KUMIKI_DATABASE_URL"] == "postgresql://kumiki@127.0.0.1:55999/kumiki"
        assert seen["env"]["KUMIKI_INSTANCE"] == f"{name}-tilt"
