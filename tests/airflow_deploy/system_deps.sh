#!/usr/bin/env bash
# Debian packages the Airflow deployment tests need: PostgreSQL (the metadata database) and Chromium (the UI
# checks drive it with Playwright; Playwright's own browser download is never used). Installs only what is
# missing; needs root (as CI and the dev machines run) or sudo.
set -euo pipefail
want=()
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || want+=(postgresql)
[ "${1:-}" = "--no-browser" ] || [ -x /usr/bin/chromium ] || want+=(chromium)
[ ${#want[@]} -eq 0 ] && exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[system-deps] installing ${want[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if [[ " ${want[*]} " == *" postgresql "* ]]; then
  # the tests run their own server; no system-wide "main" cluster
  $SUDO mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" | $SUDO tee /etc/postgresql-common/createcluster.d/trainflow.conf >/dev/null
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null
