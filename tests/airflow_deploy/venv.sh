#!/usr/bin/env bash
# Create (or reuse) the venv of one Airflow line from its compiled requirements, print its path.
#   tests/airflow_deploy/venv.sh 3.3          -> ~/.cache/trainflow/venv-airflow-3.3-<hash>
#   tests/airflow_deploy/venv.sh 3.3 --compile  re-resolve requirements/airflow-3.3.txt from airflow-3.3.in
# The project's .venv cannot hold these: kfp pins kubernetes<31, cncf.kubernetes needs >=36, and each line needs
# its own Airflow. Each line resolves under its release's constraints (the offline stand-in in tests/dist/
# constraints). The floors (2.11, 3.0) take the whole file, provider pins included, as users install: their
# deployments run the common-compat a user of that release has (1.14.1, 1.7.3). The newer lines drop the
# provider pins ("constraints-no-providers"): their deployments also hold cncf.kubernetes, the peer the
# benchmarks measure, at a release its own line did not pin. The venv is keyed by the requirements file and the checkout (it
# installs the checkout editable), so a change builds a fresh one, two checkouts never test each other's code,
# and CI and reruns share it (TRAINFLOW_AIRFLOW_VENV_ROOT, default ~/.cache/trainflow).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VERSION="${1:?usage: venv.sh AIRFLOW_MINOR [--compile]}"
REQ_IN="requirements/airflow-$VERSION.in"
REQ="requirements/airflow-$VERSION.txt"
UV="$(command -v uv || echo "$HOME/.local/bin/uv")"
export UV_CACHE_DIR="${UV_CACHE_DIR:-$HOME/.cache/uv}"
# hardlinks from the uv cache (uv's default on Linux, said here so it holds): a line's venv then costs about
# 16 MB of its own (5.6 GB apparent, torch included); the cache and the venv root must share a filesystem
export UV_LINK_MODE="${UV_LINK_MODE:-hardlink}"

if [ "${2:-}" = "--compile" ]; then
  declare -A RELEASE=([2.11]=2.11.2 [3.0]=3.0.6 [3.1]=3.1.8 [3.2]=3.2.2 [3.3]=3.3.2)
  constraints="$(mktemp)"; trap 'rm -f "$constraints"' EXIT
  src="$REPO/tests/dist/constraints/airflow-${RELEASE[$VERSION]}-py3.11.txt"
  case "$VERSION" in
    2.11|3.0) cp "$src" "$constraints"; said="airflow-${RELEASE[$VERSION]} constraints" ;;
    *) grep -v '^apache-airflow-providers-' "$src" >"$constraints"
       said="airflow-${RELEASE[$VERSION]} constraints without providers" ;;
  esac
  (cd "$REPO" && "$UV" pip compile -q -p 3.11 -c "$constraints" "tests/airflow_deploy/$REQ_IN" \
    -o "tests/airflow_deploy/$REQ")
  sed -i "s|-c $constraints|-c <$said>|" "$HERE/$REQ"
fi

# keyed by the requirements and by this checkout: the venv holds an editable install of the tree that built it
# (and by pyproject.toml: the editable install registers its entry points, the plugin's among them, when made)
key="$({ cat "$HERE/$REQ"; echo "$REPO"; cat "$REPO/pyproject.toml"; } | sha256sum | cut -c1-10)"
VENV="${TRAINFLOW_AIRFLOW_VENV_ROOT:-$HOME/.cache/trainflow}/venv-airflow-$VERSION-$key"
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"  # two lanes of make test may ask for the same line at once (e2e-airflow, e2e-pods)
flock 9
if [ ! -f "$VENV/.complete" ]; then
  rm -rf "$VENV"
  "$UV" venv -q -p 3.11 "$VENV" >&2
  (cd "$REPO" && VIRTUAL_ENV="$VENV" "$UV" pip sync -q "tests/airflow_deploy/$REQ" >&2)
  touch "$VENV/.complete"
fi
echo "$VENV"
