#!/usr/bin/env bash
# Build (if needed) and start the trainflow e2e testbed; waits until ready.
# Writes $TRAINFLOW_TESTBED_DIR/kubeconfig, env (shell exports), state.json.
# Exit non-zero, with the tail of every component log, if anything fails.
#   --pods   a real node (containerd, runc, CNI, kubelet, kube-proxy, CoreDNS) instead of kwok, and the
#            Trainer controller in cluster; image archives to import: $TRAINFLOW_TESTBED_IMAGES.
#   --kueue  Kueue's controller manager (testbed/kueue/: its CRDs, webhooks, the TrainJob integration);
#            combinable with --pods.
#   --objstore an S3-compatible object store (testbed/objstore/: the Versity S3 Gateway), its Service
#            objstore.default:9000 and Secret default/objstore-credentials; combinable with the others.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

NODE_ARGS=()
KUEUE_ARGS=()
OBJSTORE_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --pods) NODE_ARGS=(--node-bin "$("$TESTBED_SRC/node/build.sh")") ;;
    --kueue) KUEUE_ARGS=(--kueue-bin "$("$TESTBED_SRC/kueue/build.sh")") ;;
    --objstore) OBJSTORE_ARGS=(--objstore-bin "$("$TESTBED_SRC/objstore/build.sh")") ;;
    *) die "unknown argument $arg (usage: up.sh [--pods] [--kueue] [--objstore])" ;;
  esac
done
t0=$(date +%s)
BIN="$("$TESTBED_SRC/build.sh")"
UPSTREAM="$(trainer_upstream_dir)"
PY="$(testbed_python)"
"$PY" "$TESTBED_SRC/testbed.py" up --dir "$TESTBED_DIR" --bin "$BIN" --trainer-upstream "$UPSTREAM" "${NODE_ARGS[@]}" "${KUEUE_ARGS[@]}" \
  "${OBJSTORE_ARGS[@]}"
log "testbed-up total $(( $(date +%s) - t0 ))s; use: . $TESTBED_DIR/env"
