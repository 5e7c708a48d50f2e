#!/usr/bin/env bash
# Create (or reuse) the venv of one Airflow version from its compiled requirements, print its path.
#   tests/airflow_deploy/venv.sh 3.3          -> ~/.cache/trainflow/venv-airflow-3.3-<hash>
#   tests/airflow_deploy/venv.sh 3.3 --compile  re-resolve requirements/airflow-3.3.txt from airflow-3.3.in
# The project's .venv cannot hold these: kfp pins kubernetes<31, cncf.kubernetes needs >=36, and the floor
# needs its own Airflow. The venv is keyed by the requirements file and the checkout (it installs the checkout
# editable), so a change builds a fresh one and two checkouts never test each other's code.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VERSION="${1:?usage: venv.sh AIRFLOW_MINOR [--compile]}"
REQ_IN="requirements/airflow-$VERSION.in"
REQ="requirements/airflow-$VERSION.txt"
UV="$(command -v uv || echo "$HOME/.local/bin/uv")"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$HOME/.cache/uv}"

if [ "${2:-}" = "--compile" ]; then
  # The floor resolves as of its release: its constraints file is not reachable from here.
  declare -A EXCLUDE_NEWER=([3.2]=2026-06-15)
  extra=()
  [ -n "${EXCLUDE_NEWER[$VERSION]:-}" ] && extra=(--exclude-newer "${EXCLUDE_NEWER[$VERSION]}")
  (cd "$REPO" && "$UV" pip compile -q -p 3.11 "${extra[@]}" "tests/airflow_deploy/$REQ_IN" \
    -o "tests/airflow_deploy/$REQ")
fi

# keyed by the requirements and by this checkout: the venv holds an editable install of the tree that built it
key="$({ cat "$HERE/$REQ"; echo "$REPO"; } | sha256sum | cut -c1-10)"
VENV="${TRAINFLOW_AIRFLOW_VENV_ROOT:-$HOME/.cache/trainflow}/venv-airflow-$VERSION-$key"
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  "$UV" venv -q -p 3.11 "$VENV" >&2
  (cd "$REPO" && VIRTUAL_ENV="$VENV" "$UV" pip sync -q "tests/airflow_deploy/$REQ" >&2)
  touch "$VENV/.complete"
fi
echo "$VENV"
