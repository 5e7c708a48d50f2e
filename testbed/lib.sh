# shellcheck shell=bash
# Common settings for the trainflow testbed scripts. Source, don't execute.
TESTBED_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$TESTBED_SRC/.." && pwd)"
# shellcheck source=versions.env
. "$TESTBED_SRC/versions.env"

TESTBED_CACHE="${TRAINFLOW_TESTBED_CACHE:-$HOME/.cache/trainflow-testbed}"
TESTBED_DIR="${TRAINFLOW_TESTBED_DIR:-/tmp/trainflow-testbed}"

# The Go toolchain (>= 1.26): PATH, else the usual install location.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi

# Go caches live outside the repository, shared across keys.
export GOPATH="$TESTBED_CACHE/go/path"
export GOMODCACHE="$TESTBED_CACHE/go/mod"
export GOCACHE="$TESTBED_CACHE/go/cache"
export GOFLAGS="-mod=mod -buildvcs=false"
export GOTOOLCHAIN=local
export CGO_ENABLED=0

testbed_key() {
  {
    cat "$TESTBED_SRC/versions.env"
    # The control plane's modules only (go/node is the pods mode's, keyed by pods_key).
    cat "$TESTBED_SRC"/go/{controllers,k8s}/go.mod "$TESTBED_SRC"/go/{controllers,k8s}/go.sum
    go env GOVERSION GOOS GOARCH
  } | sha256sum | cut -c1-16
}

# The pods mode's node components: their pins, the go/node module, and the control plane's versions.env
# (kubelet and kube-proxy are built at K8S_VERSION).
pods_key() {
  {
    cat "$TESTBED_SRC/versions.env" "$TESTBED_SRC/node/versions.env"
    cat "$TESTBED_SRC"/go/{node,coredns}/go.mod "$TESTBED_SRC"/go/{node,coredns}/go.sum "$TESTBED_SRC/go/coredns/main.go"
    go env GOVERSION GOOS GOARCH
  } | sha256sum | cut -c1-16
}

# The Kueue mode's controller manager: its pin (kueue/versions.env), the go/kueue module and the Go version.
kueue_key() {
  {
    cat "$TESTBED_SRC/kueue/versions.env" "$TESTBED_SRC"/go/kueue/go.mod "$TESTBED_SRC"/go/kueue/go.sum
    go env GOVERSION GOOS GOARCH
  } | sha256sum | cut -c1-16
}

objstore_key() {
  {
    cat "$TESTBED_SRC/objstore/versions.env" "$TESTBED_SRC"/go/objstore/go.mod "$TESTBED_SRC"/go/objstore/go.sum
    go env GOVERSION GOOS GOARCH
  } | sha256sum | cut -c1-16
}

# Trainer v2.3.0 CRDs and default runtimes: the copies the core ships as package data (vendored unmodified but
# for the license header), so the testbed needs nothing beside the clone; TRAINFLOW_TRAINER_UPSTREAM overrides.
trainer_upstream_dir() {
  local d="${TRAINFLOW_TRAINER_UPSTREAM:-$REPO_ROOT/src/trainflow/core/data}"
  if [ -d "$d/crds" ] && [ -d "$d/runtimes" ]; then (cd "$d" && pwd); return 0; fi
  echo "trainer manifests not found: $d needs crds/ and runtimes/" >&2
  return 1
}

# -ldflags that stamp the Kubernetes version into k8s.io/kubernetes binaries (as its own build does).
k8s_ldflags() {
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local f="" pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitCommit=$K8S_GIT_COMMIT -X $pkg.gitTreeState=clean"
    f+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "-s -w$f"
}

log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# A python with PyYAML: the project's venv if present, else python3.
testbed_python() {
  local py
  for py in "$REPO_ROOT/.venv/bin/python" python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import yaml' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  die "no python with PyYAML found (run 'uv sync' first)"
}
