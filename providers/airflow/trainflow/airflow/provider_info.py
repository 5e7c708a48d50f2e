"""Provider metadata for Airflow's ProvidersManager (entry point group ``apache_airflow_provider``).

Plain data only: Airflow reads this in every process, so it imports nothing.
"""

from __future__ import annotations

from typing import Any

PACKAGE = "trainflow.airflow"
CONN_TYPE = "kubeflow_trainer"
DEFAULT_CONN_ID = "kubeflow_trainer_default"


def _str_field(label: str, description: str, **schema: Any) -> dict[str, Any]:
    return {"label": label, "description": description, "schema": {"type": ["string", "null"], **schema}}


CONN_FIELDS: dict[str, Any] = {
    "backend": _str_field(
        "Backend",
        "Where TrainJobs run: 'kubernetes' (a cluster with Kubeflow Trainer) or 'local' (embedded engine).",
        enum=["kubernetes", "local"],
        default="kubernetes",
    ),
    "in_cluster": {
        "label": "In cluster",
        "description": "Use the pod's service account (Airflow runs inside the cluster).",
        "schema": {"type": ["boolean", "null"], "default": False},
    },
    "kubeconfig_path": _str_field(
        "Kubeconfig path", "Path to a kubeconfig file on the workers and triggerer."
    ),
    "kubeconfig": _str_field(
        "Kubeconfig (inline)",
        "Whole kubeconfig as YAML or JSON; stored as a secret and never logged.",
        format="password",
    ),
    "context": _str_field("Kubeconfig context", "Context to use from the kubeconfig (default: current)."),
    "namespace": _str_field("Namespace", "Default namespace of TrainJobs (operators can override it)."),
    "local_home": _str_field(
        "Local state directory", "State directory of the local engine (default: $TRAINFLOW_HOME)."
    ),
}

CONFIG_OPTIONS: dict[str, Any] = {
    "default_deferrable": {
        "description": (
            "Default of the 'deferrable' argument of TrainJobOperator and TrainJobSensor. Unset: "
            "[operators] default_deferrable decides, as for every deferrable operator."
        ),
        "version_added": "0.1.0",
        "type": "boolean",
        "example": "True",
        "default": None,
    },
    "dashboard_url_template": {
        "description": (
            "URL of a TrainJob in your dashboard, for the 'TrainJob' extra link; placeholders {name}, "
            "{namespace}, {uid}. Empty: no link."
        ),
        "version_added": "0.1.0",
        "type": "string",
        "example": "https://kubeflow.example.com/trainer/{namespace}/trainjobs/{name}",
        "default": "",
    },
    "default_backend": {
        "description": (
            "Backend used when the connection does not exist: 'kubernetes' (kubeconfig / in-cluster "
            "discovery) or 'local'."
        ),
        "version_added": "0.1.0",
        "type": "string",
        "example": "local",
        "default": "kubernetes",
    },
    "local_home": {
        "description": "State directory of the local engine when the connection names none.",
        "version_added": "0.1.0",
        "type": "string",
        "example": "/opt/airflow/trainflow",
        "default": "",
    },
    "task_instance_view": {
        "description": (
            "Also show a task's TrainJob page as a 'TrainJob' tab of the task instance page (Airflow >= 3.1). "
            "Airflow shows plugin tabs on every task's page, so it is off; the 'TrainJob page' extra link "
            "is always there."
        ),
        "version_added": "0.1.0",
        "type": "boolean",
        "example": "True",
        "default": "False",
    },
    "max_log_lines": {
        "description": "Most rank-0 log lines copied into one task log when log streaming is on.",
        "version_added": "0.1.0",
        "type": "integer",
        "example": "2000",
        "default": "1000",
    },
}


def get_provider_info() -> dict[str, Any]:
    """What this provider contributes to Airflow: hook, connection form, operators, trigger, links, config."""
    return {
        "package-name": "trainflow",
        "name": "Kubeflow Trainer (trainflow)",
        "description": "Run Kubeflow Trainer v2 TrainJobs from Airflow: submit, reattach, defer, clean up.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Kubeflow Trainer",
                "external-doc-url": "https://www.kubeflow.org/docs/components/trainer/",
                "tags": ["software"],
            }
        ],
        "operators": [
            {"integration-name": "Kubeflow Trainer", "python-modules": [f"{PACKAGE}.operators"]},
        ],
        "sensors": [
            {"integration-name": "Kubeflow Trainer", "python-modules": [f"{PACKAGE}.sensors"]},
        ],
        "hooks": [
            {"integration-name": "Kubeflow Trainer", "python-modules": [f"{PACKAGE}.hooks"]},
        ],
        "triggers": [
            {"integration-name": "Kubeflow Trainer", "python-modules": [f"{PACKAGE}.triggers"]},
        ],
        "connection-types": [
            {
                "hook-class-name": f"{PACKAGE}.hooks.TrainJobHook",
                "hook-name": "Kubeflow Trainer",
                "connection-type": CONN_TYPE,
                "conn-fields": CONN_FIELDS,
                "ui-field-behaviour": {
                    "hidden-fields": ["host", "schema", "port", "login", "password"],
                    "relabeling": {},
                    "placeholders": {},
                },
            }
        ],
        "extra-links": [f"{PACKAGE}.links.TrainJobLink", f"{PACKAGE}.links.TrainJobPageLink"],
        "task-decorators": [{"class-name": f"{PACKAGE}.decorators.trainjob_task", "name": "trainjob"}],
        "config": {
            "trainflow": {
                "description": "Options of the trainflow provider (Kubeflow Trainer TrainJobs).",
                "options": CONFIG_OPTIONS,
            }
        },
    }
