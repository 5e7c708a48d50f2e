#!/usr/bin/env bash
# Build (once per pinned-version key) the testbed's S3-compatible object store: the Versity S3 Gateway
# (versitygw), from its module in the Go module proxy. Output: $TRAINFLOW_TESTBED_CACHE/objstore/<key>/ (the
# binary and VERSIONS); prints that directory.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
# shellcheck source=versions.env
. "$TESTBED_SRC/objstore/versions.env"

command -v go >/dev/null || die "go toolchain not found (need Go >= 1.26)"
KEY="$(objstore_key)"
OUT="$TESTBED_CACHE/objstore/$KEY"
MOD="$TESTBED_SRC/go/objstore"
PKG=github.com/versity/versitygw
if [ -f "$OUT/.complete" ]; then echo "$OUT"; exit 0; fi
v="$(cd "$MOD" && go list -m -f '{{.Version}}' "$PKG")"
[ "$v" = "$VERSITYGW_VERSION" ] || die "go/objstore/go.mod requires $PKG $v, versions.env says $VERSITYGW_VERSION"
mkdir -p "$OUT" "$GOMODCACHE" "$GOCACHE" "$GOPATH"
start=$(date +%s)
log "cold build of versitygw $VERSITYGW_VERSION into $OUT (go $(go env GOVERSION), $(nproc) cores)"
(cd "$MOD" && go mod download)
t0=$(date +%s)
(cd "$MOD" && nice -n "${TESTBED_BUILD_NICE:-10}" go build -trimpath -p "${TESTBED_BUILD_PARALLEL:-$(nproc)}" \
  -ldflags "-s -w -X main.Version=$VERSITYGW_VERSION" -o "$OUT/versitygw.tmp" "$PKG/cmd/versitygw")
mv "$OUT/versitygw.tmp" "$OUT/versitygw"
cat > "$OUT/VERSIONS" <<EOV
key=$KEY
go=$(go env GOVERSION)
versitygw=$VERSITYGW_VERSION
download_seconds=$(( t0 - start ))
compile_seconds=$(( $(date +%s) - t0 ))
EOV
touch "$OUT/.complete"
log "versitygw build complete in $(( $(date +%s) - start ))s"
echo "$OUT"
