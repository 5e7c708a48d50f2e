#!/usr/bin/env bash
# Build (once per pinned-version key) every binary the testbed runs:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# kwok, the JobSet controller and the Kubeflow Trainer controller manager.
# Output: $TRAINFLOW_TESTBED_CACHE/bin/<key>/ ; prints that directory.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

command -v go >/dev/null || die "go toolchain not found (need Go >= 1.26)"
KEY="$(testbed_key)"
BIN="$TESTBED_CACHE/bin/$KEY"

stage_manifests() {
  # Upstream data files taken from the pinned modules in the Go module cache
  # (never committed): JobSet CRDs + webhook configs, Trainer webhook configs,
  # kwok Stage definitions.
  local js tr kw m="$BIN/manifests"
  if [ -f "$m/.complete" ]; then stage_kwok_crds; return 0; fi
  (cd "$TESTBED_SRC/go/controllers" && go mod download sigs.k8s.io/jobset sigs.k8s.io/kwok github.com/kubeflow/trainer/v2)
  js="$(cd "$TESTBED_SRC/go/controllers" && go list -m -f '{{.Dir}}' sigs.k8s.io/jobset)"
  tr="$(cd "$TESTBED_SRC/go/controllers" && go list -m -f '{{.Dir}}' github.com/kubeflow/trainer/v2)"
  kw="$(cd "$TESTBED_SRC/go/controllers" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  rm -rf "$m"; mkdir -p "$m/jobset/crd" "$m/jobset/webhook" "$m/trainer/webhook" "$m/kwok"
  cp "$js"/config/components/crd/bases/*.yaml "$m/jobset/crd/"
  cp "$js"/config/components/webhook/manifests.yaml "$m/jobset/webhook/"
  cp "$js"/config/components/webhook/patches/*.yaml "$m/jobset/webhook/"
  cp "$tr"/manifests/base/webhook/manifests.yaml "$tr"/manifests/base/webhook/patch_*.yaml "$m/trainer/webhook/"
  cp "$kw"/kustomize/stage/node/fast/node-initialize.yaml \
     "$kw"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
     "$kw"/kustomize/stage/pod/general/pod-*.yaml \
     "$kw"/kustomize/stage/pod/chaos/pod-container-running-failed.yaml "$m/kwok/"
  chmod -R u+w "$m"
  stage_kwok_crds
  touch "$m/.complete"
}

stage_kwok_crds() {
  # kwok's Logs CRD (a pod given a log file of its own). Staged on its own, so that a cache staged before it
  # gains it in place without re-staging what running instances read.
  local kw d="$BIN/manifests/kwok-crd"
  [ -f "$d/kwok.x-k8s.io_logs.yaml" ] && return 0
  kw="$(cd "$TESTBED_SRC/go/controllers" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  mkdir -p "$d.$$"
  cp "$kw"/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml "$d.$$/"
  chmod -R u+w "$d.$$"
  mv -T "$d.$$" "$d" 2>/dev/null || rm -rf "$d.$$"
}

if [ -f "$BIN/.complete" ]; then
  stage_manifests
  echo "$BIN"; exit 0
fi
mkdir -p "$BIN" "$GOMODCACHE" "$GOCACHE" "$GOPATH"
start=$(date +%s)
log "cold build into $BIN (go $(go env GOVERSION), $(nproc) cores)"

NICE="nice -n ${TESTBED_BUILD_NICE:-10}"
P="${TESTBED_BUILD_PARALLEL:-$(nproc)}"


build_one() { # module-dir output package [ldflags]
  local mod="$1" out="$2" pkg="$3" ldf="${4:--s -w}"
  if [ -x "$BIN/$out" ]; then log "have $out"; return 0; fi
  local t0; t0=$(date +%s)
  log "building $out ($pkg)"
  (cd "$TESTBED_SRC/go/$mod" && $NICE go build -trimpath -p "$P" -ldflags "$ldf" -o "$BIN/$out.tmp" "$pkg")
  mv "$BIN/$out.tmp" "$BIN/$out"
  log "built $out in $(( $(date +%s) - t0 ))s"
}

(cd "$TESTBED_SRC/go/k8s" && go mod download)
(cd "$TESTBED_SRC/go/controllers" && go mod download)

LDF="$(k8s_ldflags)"
build_one k8s etcd go.etcd.io/etcd/server/v3
build_one k8s kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$LDF"
build_one k8s kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$LDF"
build_one k8s kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$LDF"
build_one k8s kubectl k8s.io/kubernetes/cmd/kubectl "$LDF"
build_one controllers kwok sigs.k8s.io/kwok/cmd/kwok
build_one controllers jobset-controller sigs.k8s.io/jobset
build_one controllers trainer-controller-manager github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager

stage_manifests
cat > "$BIN/VERSIONS" <<EOV
key=$KEY
go=$(go env GOVERSION)
kubernetes=$K8S_VERSION
etcd=$ETCD_VERSION
kwok=$KWOK_VERSION
jobset=$JOBSET_VERSION
trainer=$TRAINER_VERSION
cold_build_seconds=$(( $(date +%s) - start ))
EOV
touch "$BIN/.complete"
log "build complete in $(( $(date +%s) - start ))s"
echo "$BIN"
