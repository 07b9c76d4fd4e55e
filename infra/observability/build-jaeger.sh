#!/usr/bin/env bash
# Builds Jaeger v2 (the all-in-one collector + memory storage + query API) from the Go module proxy into
# ~/.cache/kumiki/jaeger-<version>/jaeger and prints the binary's path. Cached: a second call prints the path
# at once. Module v1.76.0 is the Jaeger v2.13.0 release. The Jaeger UI is a separate JavaScript build and is
# not part of the module: the binary serves a placeholder page at /, the query API (/api/traces) is real.
set -euo pipefail
VERSION="${KUMIKI_JAEGER_MODULE_VERSION:-v1.76.0}"
CACHE="${KUMIKI_CACHE:-$HOME/.cache/kumiki}"
DIR="$CACHE/jaeger-$VERSION"
BIN="$DIR/jaeger"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
[ -x "$GO" ] || { echo "build-jaeger: Go not found (set GO=/path/to/go)" >&2; exit 2; }
mkdir -p "$DIR/src"
cd "$DIR/src"
[ -f go.mod ] || "$GO" mod init kumiki.local/jaeger-build >/dev/null 2>&1
"$GO" get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$VERSION" >&2
# -s -w: about 85 MB instead of 120; CGO off: a static binary like the release's
CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o "$BIN.tmp" github.com/jaegertracing/jaeger/cmd/jaeger >&2
mv "$BIN.tmp" "$BIN"
echo "$BIN"
