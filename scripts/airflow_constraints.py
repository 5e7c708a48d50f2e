"""Write an offline stand-in for Airflow's constraints file of one release, resolved from PyPI alone.

Airflow publishes ``constraints-<version>/constraints-3.11.txt`` on GitHub, which the test machines cannot
reach. Airflow makes that file by resolving ``apache-airflow[all]`` (every provider) to the highest versions
on PyPI when the release is cut. This script does the same with ``uv pip compile --exclude-newer`` set just
after the release's upload time, so the pins are those a user installing that release then would get.
The result is checked in under tests/dist/constraints/ and used by tests/dist (no network resolution in CI).

    python scripts/airflow_constraints.py 3.0.6
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "dist" / "constraints"
PYTHON = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
# The release's wheels and its provider/core packages are uploaded within minutes of each other.
GRACE = timedelta(hours=2)


def release_time(version: str) -> datetime:
    """Upload time of the first file of apache-airflow==version on PyPI (its JSON API)."""
    with urllib.request.urlopen("https://pypi.org/pypi/apache-airflow/json", timeout=60) as resp:
        files = json.load(resp)["releases"].get(version) or []
    if not files:
        raise SystemExit(f"apache-airflow {version} has no files on PyPI")
    return min(datetime.fromisoformat(f["upload_time_iso_8601"].replace("Z", "+00:00")) for f in files)


def compile_constraints(version: str, cutoff: datetime) -> list[str]:
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "airflow.in"
        req.write_text(f"apache-airflow[all]=={version}\n")
        out = Path(tmp) / "constraints.txt"
        cmd = [uv, "pip", "compile", "-q", str(req), "-p", PYTHON, "--python-platform", PLATFORM,
               "--exclude-newer", cutoff.strftime("%Y-%m-%dT%H:%M:%SZ"), "--no-annotate", "--no-header",
               "-o", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, env={**os.environ, "UV_NO_CONFIG": "1"})
        return [line for line in out.read_text().splitlines() if line and not line.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="Airflow release, e.g. 3.0.6")
    opts = parser.parse_args(argv)
    cutoff = release_time(opts.version) + GRACE
    pins = compile_constraints(opts.version, cutoff)
    header = [
        f"# Stand-in for Airflow's constraints-{opts.version}/constraints-{PYTHON}.txt, made offline from PyPI by",
        f"# scripts/airflow_constraints.py: apache-airflow[all]=={opts.version} resolved to the highest versions",
        f"# uploaded before {cutoff:%Y-%m-%dT%H:%M:%SZ} (the release's upload time + {GRACE}),",
        f"# for Python {PYTHON} on {PLATFORM}.",
    ]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"airflow-{opts.version}-py{PYTHON}.txt"
    path.write_text("\n".join([*header, *pins]) + "\n")
    print(f"wrote {path.relative_to(ROOT)} ({len(pins)} pins)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
