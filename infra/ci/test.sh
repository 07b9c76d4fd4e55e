#!/usr/bin/env bash
# The test command (README, "Run the tests"; .ci/run calls exactly this).
# On a fresh Debian machine it installs what the tests need, starts Apache Kafka (KRaft, jars from Maven
# Central) and PostgreSQL (Debian package) on loopback, runs the whole suite, and stops them again.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export KUMIKI_HOME="${KUMIKI_CI_HOME:-$ROOT/.kumiki/ci}"
PY="${PYTHON:-python3}"

need=()
# prometheus: its promtool checks and unit-tests the chart's alerting rules (tests/charts); its server scrapes the
# live stack in tests/observability; openssl: the Kubernetes test stack's service-account key pair
for pkg in postgresql maven default-jre-headless gcc prometheus openssl; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # the tests start their own Postgres and Prometheus servers: keep packages from starting daemons
  own_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
  fi
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  [ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
  # the Debian package starts its own cluster on 5432; the tests use their own, so stop it
  command -v pg_ctlcluster >/dev/null && (pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | while read -r v c; do pg_ctlcluster "$v" "$c" stop || true; done)
fi

# helm and kubeconform for the chart tests (tests/charts), built with Go in the background while the rest
# installs: ~4 min cold, seconds once the module cache is warm. Without Go the chart tests skip and say why.
export PATH="$HOME/go/bin:$PATH"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
# The binder's control plane (tests/binder): kube-apiserver and kube-scheduler v1.37.2, etcd v3.7.0 and KWOK
# v0.8.0 from the Go module proxy, started first since it is the longest (~12 min cold on 2 cores, seconds once
# cached in ~/.cache/kumiki). Without it the binder's integration tests skip and say why.
# Each build writes its exit status to a file in $builds when it ends, so that the tests which need it can wait for
# it from a subshell too (`wait` only knows the shell's own children).
builds=$(mktemp -d "${TMPDIR:-/tmp}/kumiki-builds.XXXXXX")
started=()  # the background builds: "NAME|what it builds|the tests that skip without it"
in_background() {  # NAME WHAT SKIPPING COMMAND...: run COMMAND in the background, its output in $builds/NAME.log
  local name=$1
  started+=("$1|$2|$3")
  shift 3
  ( status=0; "$@" >"$builds/$name.log" 2>&1 || status=$?; echo "$status" >"$builds/$name.status" ) &
}
if [ -x "$GO" ]; then
  echo "== building kube-apiserver, kube-scheduler, etcd and KWOK with $GO (background)"
  in_background kube "the Kubernetes components" "binder tests" env GO="$GO" bash infra/kube/build.sh
fi
# Jaeger v2 for the observability tests (tests/observability): built from the Go module proxy in the background
# (infra/observability/build-jaeger.sh, cached in ~/.cache/kumiki). Without it the Jaeger tests skip and say why.
if [ -x "$GO" ]; then
  echo "== building Jaeger v2 with $GO (background)"
  in_background jaeger "Jaeger" "Jaeger tests" env GO="$GO" bash infra/observability/build-jaeger.sh
fi
if [ -x "$GO" ] && ! { command -v helm >/dev/null && command -v kubeconform >/dev/null; }; then
  echo "== building helm and kubeconform with $GO (background)"
  in_background go-tools "helm and kubeconform" "chart tests" \
    bash -c '"$1" install helm.sh/helm/v3/cmd/helm@v3.22.0 && "$1" install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0' _ "$GO"
fi

echo "== python environment (.venv)"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev,local]'

echo "== starting Apache Kafka and PostgreSQL on loopback"
cleanup() { .venv/bin/kumiki down >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
unset KUMIKI_KAFKA_BOOTSTRAP KUMIKI_DATABASE_URL
KAFKA_PORT=$(.venv/bin/python -c 'from kumiki.devstack.processes import free_port; print(free_port())')
PG_PORT=$(.venv/bin/python -c 'from kumiki.devstack.processes import free_port; print(free_port())')
exports=$(.venv/bin/kumiki up --infra-only --broker kafka --database system --kafka-port "$KAFKA_PORT" --postgres-port "$PG_PORT")
eval "$exports"
export KUMIKI_TEST_KAFKA_BOOTSTRAP="$KUMIKI_KAFKA_BOOTSTRAP" KUMIKI_TEST_DATABASE_URL="$KUMIKI_DATABASE_URL"
unset KUMIKI_KAFKA_BOOTSTRAP KUMIKI_DATABASE_URL
echo "   Kafka $KUMIKI_TEST_KAFKA_BOOTSTRAP, Postgres $KUMIKI_TEST_DATABASE_URL"

echo "== lint and types"
.venv/bin/ruff check services tests benchmarks --output-format concise
.venv/bin/mypy

# The tests that need a Go-built tool (helm, kubeconform, Jaeger, kube-apiserver/etcd/KWOK) start as soon as the
# builds end, in a second pytest beside the rest: the builds and those tests take the CPU, the rest mostly waits on
# brokers and sockets. Each test has its own topics and database, so the two runs share Kafka and Postgres safely.
GO_BUILT_TESTS=(tests/binder tests/charts tests/observability tests/tilt tests/cli/test_trace.py tests/replay/test_kube.py
  tests/preemption/test_kube_identity.py tests/telemetry/adapters/test_agent_identity.py tests/common/test_kube_tokens.py)
built() {  # NAME: wait for that background build, then its exit status
  while [ ! -e "$builds/$1.status" ]; do sleep 1; done
  return "$(cat "$builds/$1.status")"
}
wait_for_builds() {
  local build name what skipping
  for build in ${started[@]+"${started[@]}"}; do
    IFS='|' read -r name what skipping <<<"$build"
    if built "$name"; then
      # the Kubernetes components are found through the paths the build prints
      if [ "$name" = kube ]; then eval "$(bash infra/kube/build.sh --print)"; fi
      echo "   $what built"
    else
      echo "   WARNING: $what did not build ($skipping will skip):"; tail -5 "$builds/$name.log"
    fi
  done
}
pytest_run() {  # NAME PATHS...: pytest in its own base temporary directory
  local name=$1
  shift
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider --basetemp="$builds/pytest-$name" "$@"
}
if [ $# -gt 0 ]; then  # the tests named on the command line, once every tool is there
  wait_for_builds
  echo "== tests"
  pytest_run named "$@"
  exit 0
fi
ignores=()
for path in "${GO_BUILT_TESTS[@]}"; do ignores+=("--ignore=$path"); done
status=0
# its output goes to a file, shown once the first run has ended (and followed from there until it ends too)
( wait_for_builds; echo "== tests that need the Go-built tools (started once the builds ended)"; pytest_run go-built "${GO_BUILT_TESTS[@]}" ) \
  >"$builds/go-built-tests.log" 2>&1 &
go_built_tests=$!
echo "== tests (the ones that need the Go-built tools run beside them once the builds end)"
pytest_run rest "${ignores[@]}" || status=$?
tail -n +1 -f --pid="$go_built_tests" "$builds/go-built-tests.log"
wait "$go_built_tests" || status=$?
exit $status
