#!/usr/bin/env bash
# Build (once per pinned-version key) Kueue's controller manager for the testbed's Kueue mode, and stage its
# manifests (CRDs, webhook configurations and their kustomize patches, the CRDs' conversion-webhook patches)
# from the pinned module in the Go module cache (never committed).
# Output: $TRAINFLOW_TESTBED_CACHE/kueue/<key>/ ; prints that directory.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
# shellcheck source=versions.env
. "$TESTBED_SRC/kueue/versions.env"

command -v go >/dev/null || die "go toolchain not found (need Go >= 1.26)"
KEY="$(kueue_key)"
OUT="$TESTBED_CACHE/kueue/$KEY"
MOD="$TESTBED_SRC/go/kueue"
NICE="nice -n ${TESTBED_BUILD_NICE:-10}"
P="${TESTBED_BUILD_PARALLEL:-$(nproc)}"

module_dir() {
  local v
  v="$(cd "$MOD" && go list -m -f '{{.Version}}' sigs.k8s.io/kueue)"
  [ "$v" = "$KUEUE_VERSION" ] || die "go/kueue/go.mod requires sigs.k8s.io/kueue $v, versions.env says $KUEUE_VERSION"
  (cd "$MOD" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
}

stage_manifests() {
  local src m="$OUT/manifests"
  [ -f "$m/.complete" ] && return 0
  (cd "$MOD" && go mod download sigs.k8s.io/kueue)
  src="$(module_dir)"
  rm -rf "$m"; mkdir -p "$m/crd" "$m/crd-patches" "$m/webhook"
  cp "$src"/config/components/crd/bases/*.yaml "$m/crd/"
  cp "$src"/config/components/crd/kustomization.yaml "$src"/config/components/crd/patches/webhook_in_*.yaml "$m/crd-patches/"
  cp "$src"/config/components/webhook/manifests.yaml "$src"/config/components/webhook/kustomization.yaml "$m/webhook/"
  chmod -R u+w "$m"
  touch "$m/.complete"
}

if [ -f "$OUT/.complete" ]; then
  stage_manifests
  echo "$OUT"; exit 0
fi
mkdir -p "$OUT" "$GOMODCACHE" "$GOCACHE" "$GOPATH"
start=$(date +%s)
log "cold build of Kueue $KUEUE_VERSION into $OUT (go $(go env GOVERSION), $(nproc) cores)"
(cd "$MOD" && go mod download)
t0=$(date +%s)
VPKG=sigs.k8s.io/kueue/pkg/version
(cd "$MOD" && $NICE go build -trimpath -p "$P" \
  -ldflags "-s -w -X $VPKG.GitVersion=$KUEUE_VERSION -X $VPKG.GitCommit=$KUEUE_VERSION -X $VPKG.BuildDate=1970-01-01T00:00:00Z" \
  -o "$OUT/kueue.tmp" sigs.k8s.io/kueue/cmd/kueue)
mv "$OUT/kueue.tmp" "$OUT/kueue"
compile=$(( $(date +%s) - t0 ))
stage_manifests
cat > "$OUT/VERSIONS" <<EOV
key=$KEY
go=$(go env GOVERSION)
kueue=$KUEUE_VERSION
download_seconds=$(( t0 - start ))
compile_seconds=$compile
cold_build_seconds=$(( $(date +%s) - start ))
EOV
touch "$OUT/.complete"
log "Kueue build complete in $(( $(date +%s) - start ))s (compile ${compile}s)"
echo "$OUT"
