#!/usr/bin/env bash
# Builds the real Kubernetes components the binder's tests, the benchmark and `kumiki up --kubernetes` run:
# kube-apiserver and kube-scheduler v1.37.2, etcd v3.7.0 and KWOK v0.8.0, all from the Go module proxy.
# Binaries and KWOK's stage files land in $KUMIKI_KUBE_HOME (default ~/.cache/kumiki/kube-v1.37.2);
# a second run finds them and returns in well under a second. Go's own caches (~/go, ~/.cache/go-build)
# make a rebuild after a cache wipe take seconds too.
#
#   infra/kube/build.sh            build what is missing, print `export KUMIKI_KUBE_*=...` lines
#   infra/kube/build.sh --print    print the export lines only (exit 1 if anything is missing)
set -euo pipefail
K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.0}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HOME_DIR="${KUMIKI_KUBE_HOME:-$HOME/.cache/kumiki/kube-$K8S_VERSION}"
BIN="$HOME_DIR/bin"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:--buildvcs=false}"

print_exports() {
  echo "export KUMIKI_KUBE_APISERVER=$BIN/kube-apiserver"
  echo "export KUMIKI_KUBE_SCHEDULER=$BIN/kube-scheduler"
  echo "export KUMIKI_ETCD=$BIN/etcd"
  echo "export KUMIKI_KWOK=$BIN/kwok"
  echo "export KUMIKI_KWOK_STAGES=$HOME_DIR/stages"
}
complete() {
  [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-scheduler" ] && [ -x "$BIN/etcd" ] && [ -x "$BIN/kwok" ] \
    && [ -f "$HOME_DIR/stages/pod-complete.yaml" ]
}
if [ "${1:-}" = "--print" ]; then complete || exit 1; print_exports; exit 0; fi
if complete; then print_exports; exit 0; fi
[ -x "$GO" ] || { echo "build.sh: Go not found (set GO=/path/to/go)" >&2; exit 2; }
mkdir -p "$BIN" "$HOME_DIR/src"
log() { echo "[kube-build $(date -u +%H:%M:%S)] $*" >&2; }

# kube-apiserver and kube-scheduler: a wrapper module requiring k8s.io/kubernetes. Kubernetes' go.mod
# requires its staging modules as v0.0.0 with replaces into ./staging, which Go ignores in a dependency,
# so the wrapper replaces each with its published tag (v0.37.2 for v1.37.2), read from that go.mod.
if [ ! -x "$BIN/kube-apiserver" ] || [ ! -x "$BIN/kube-scheduler" ]; then
  W="$HOME_DIR/src/kubernetes"
  mkdir -p "$W"
  staging_tag="v0.${K8S_VERSION#v1.}"
  log "downloading k8s.io/kubernetes@$K8S_VERSION go.mod"
  modfile=$(cd "$W" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module kumiki.local/kube-build"
    echo
    echo "go $(sed -n 's/^go \([0-9.]*\).*/\1/p' "$modfile")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # every staging module (required as v0.0.0) except the samples, which publish no matching tags
    grep -E '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0$' "$modfile" | awk '{print $1}' | sort -u | grep -v '/sample-' |
      while read -r m; do echo "replace $m => $m $staging_tag"; done
  } >"$W/go.mod"
  echo 'package main' >"$W/main.go"
  echo 'func main() {}' >>"$W/main.go"
  pkg=k8s.io/component-base/version
  minor=$(echo "${K8S_VERSION#v1.}" | cut -d. -f1)
  ldflags="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  log "resolving modules"
  (cd "$W" && "$GO" get "k8s.io/kubernetes@$K8S_VERSION" >&2)
  log "building kube-apiserver and kube-scheduler (about 10 min on 2 cores, cold)"
  (cd "$W" && "$GO" build -mod=mod -trimpath -ldflags "$ldflags" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler)
fi

# etcd: its server module carries replaces for its sibling modules, so `go install @version` refuses it;
# a wrapper module requiring go.etcd.io/etcd/server/v3 builds the same main package.
if [ ! -x "$BIN/etcd" ]; then
  W="$HOME_DIR/src/etcd"
  mkdir -p "$W"
  printf 'module kumiki.local/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$W/go.mod"
  # a stand-in main importing what etcd's own main does, so `go mod tidy` records every module it needs
  printf 'package main\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n\nfunc main() {}\n' >"$W/main.go"
  log "building etcd $ETCD_VERSION"
  (cd "$W" && "$GO" mod tidy >&2 && "$GO" build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
fi

# KWOK: a plain `go install`; its stage files (node-initialize, node-heartbeat, pod-ready, pod-complete,
# pod-delete) come from the same module's kustomize/stage folder. Kumiki's own stages stay in infra/kube/stages
# (kumiki.devstack.kube gives KWOK both folders).
if [ ! -x "$BIN/kwok" ] || [ ! -f "$HOME_DIR/stages/pod-complete.yaml" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$BIN" "$GO" install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  src="$("$GO" env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  mkdir -p "$HOME_DIR/stages"
  for f in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-complete \
    pod/fast/pod-delete; do
    install -m 0644 "$src/$f.yaml" "$HOME_DIR/stages/$(basename "$f").yaml"
  done
fi
complete || { echo "build.sh: something did not build" >&2; exit 1; }
print_exports
