#!/usr/bin/env bash
# Build (once per pinned-version key) what the testbed's pods mode adds to the control plane: kubelet and
# kube-proxy (k8s.io/kubernetes, the control plane's release), containerd + runc shim + ctr, runc (cgo,
# seccomp), the CNI plugins, CoreDNS (go/coredns), and the pause sandbox image. Installs the Debian packages it needs
# (NODE_DEB_PACKAGES) when missing. Output: $TRAINFLOW_TESTBED_CACHE/pods/<key>/ ; prints that directory.
set -euo pipefail
. "$(dirname "$0")/../lib.sh"
# shellcheck source=versions.env
. "$TESTBED_SRC/node/versions.env"

command -v go >/dev/null || die "go toolchain not found (need Go >= 1.26)"
KEY="$(pods_key)"
OUT="$TESTBED_CACHE/pods/$KEY"
NICE="nice -n ${TESTBED_BUILD_NICE:-10}"
P="${TESTBED_BUILD_PARALLEL:-$(nproc)}"

stage_manifests() {
  # Trainer's in-cluster install (manager, RBAC, webhook) and the runtimes overlay users apply, from the
  # pinned module in the Go module cache (never committed).
  local tr m="$OUT/manifests"
  [ -f "$m/.complete" ] && return 0
  (cd "$TESTBED_SRC/go/controllers" && go mod download github.com/kubeflow/trainer/v2)
  tr="$(cd "$TESTBED_SRC/go/controllers" && go list -m -f '{{.Dir}}' github.com/kubeflow/trainer/v2)"
  rm -rf "$m"; mkdir -p "$m/trainer"
  cp -r "$tr/manifests/base" "$tr/manifests/overlays" "$m/trainer/"
  chmod -R u+w "$m"
  touch "$m/.complete"
}

# Debian packages the pods suite uses on the host (not part of the build key): Open MPI's mpirun for the local
# engine's MPI test (tests/e2e_pods/test_local_mpi.py).
SUITE_DEB_PACKAGES="openmpi-bin"

install_debs() {
  local p missing=""
  for p in $NODE_DEB_PACKAGES $SUITE_DEB_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing+=" $p"; done
  [ -z "$missing" ] && return 0
  log "installing Debian packages:$missing"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing; } >&2 \
    || die "apt-get install$missing failed"
}
# --deps: only the Debian packages (make test installs every suite's packages first: apt allows one at a time;
# make e2e-pods checks them before it starts)
if [ "${1:-}" = "--deps" ]; then install_debs; exit 0; fi

if [ -f "$OUT/.complete" ]; then
  stage_manifests
  echo "$OUT"; exit 0
fi
install_debs

mkdir -p "$OUT/cni" "$GOMODCACHE" "$GOCACHE" "$GOPATH"
start=$(date +%s)
log "cold build of the node components into $OUT (go $(go env GOVERSION), $(nproc) cores)"

timed() { # name command...
  local name="$1" t0; shift; t0=$(date +%s)
  log "building $name"
  "$@"
  log "built $name in $(( $(date +%s) - t0 ))s"
  echo "build_seconds_$name=$(( $(date +%s) - t0 ))" >> "$OUT/VERSIONS.tmp"
}
# `go install module/pkg@version` builds each tool against its own go.mod (no replace directives in
# these modules), verified against the checksum database; GOBIN picks the output directory.
gi() { # cgo gobin ldflags/tags... -- pkgs...
  local cgo="$1" gobin="$2"; shift 2
  (cd "$OUT" && CGO_ENABLED="$cgo" GOBIN="$gobin" GOFLAGS="-trimpath -buildvcs=false" $NICE go install -p "$P" "$@")
}
: > "$OUT/VERSIONS.tmp"
kube() {
  (cd "$TESTBED_SRC/go/node" && go mod download && \
   $NICE go build -trimpath -p "$P" -ldflags "$(k8s_ldflags)" -o "$OUT/" \
     k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
}
timed kubelet kube
C=github.com/containerd/containerd/v2/cmd
timed containerd gi 0 "$OUT" -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
  "$C/containerd@$CONTAINERD_VERSION" "$C/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$C/ctr@$CONTAINERD_VERSION"
timed runc gi 1 "$OUT" -tags seccomp -ldflags "-s -w" "github.com/opencontainers/runc@$RUNC_VERSION"
CNI=github.com/containernetworking/plugins/plugins
timed cni gi 0 "$OUT/cni" -ldflags "-s -w" "$CNI/main/bridge@$CNI_PLUGINS_VERSION" \
  "$CNI/ipam/host-local@$CNI_PLUGINS_VERSION" "$CNI/main/loopback@$CNI_PLUGINS_VERSION" \
  "$CNI/meta/portmap@$CNI_PLUGINS_VERSION"
coredns() { # go/coredns: CoreDNS with the plugins the Corefile uses (the full build takes ~13 min on 2 cores)
  (cd "$TESTBED_SRC/go/coredns" && go mod download && $NICE go build -trimpath -p "$P" -ldflags "-s -w" -o "$OUT/coredns" .)
}
timed coredns coredns

# The pause image: pause.c from the k8s.io/kubernetes module, static, FROM scratch, USER 65535 (as upstream).
K8S_DIR="$(cd "$TESTBED_SRC/go/node" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
mkdir -p "$OUT/pause"
gcc -Os -Wall -Werror -static -DVERSION="${PAUSE_IMAGE##*:}" -o "$OUT/pause/pause" "$K8S_DIR/build/pause/linux/pause.c"
strip "$OUT/pause/pause"
python3 "$TESTBED_SRC/node/oci.py" "$OUT/pause.oci.tar" --name "$PAUSE_IMAGE" --entrypoint '["/pause"]' \
  --user 65535:65535 "$OUT/pause/pause=/pause:755" >/dev/null

stage_manifests
{
  echo "key=$KEY"
  echo "go=$(go env GOVERSION)"
  echo "kubernetes=$K8S_VERSION"
  echo "containerd=$CONTAINERD_VERSION"
  echo "runc=$RUNC_VERSION"
  echo "cni_plugins=$CNI_PLUGINS_VERSION"
  echo "coredns=$COREDNS_VERSION"
  echo "pause_image=$PAUSE_IMAGE"
  cat "$OUT/VERSIONS.tmp"
  echo "cold_build_seconds=$(( $(date +%s) - start ))"
} > "$OUT/VERSIONS"
rm -f "$OUT/VERSIONS.tmp"
touch "$OUT/.complete"
log "node build complete in $(( $(date +%s) - start ))s"
echo "$OUT"
