"""The repository's example DAGs in the test deployment, as a user copies them into an Airflow DAG folder.

Only where ``TRAINFLOW_DEPLOY_EXAMPLES`` is set (run.sh's floor suite): they are scheduled, so the scheduler
starts their runs as soon as it reads them, and the newest line's suite does not want those runs beside its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("TRAINFLOW_DEPLOY_EXAMPLES"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "dags_examples"))  # example_training beside
    from trainflow_retraining import dag as trainflow_retraining  # noqa: F401  (the DAG bag finds it here)
