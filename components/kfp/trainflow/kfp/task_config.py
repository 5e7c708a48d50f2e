"""A kfp ``dsl.TaskConfig`` (resources, env, tolerations, node selector, affinity, volumes) as request fields."""

from __future__ import annotations

from typing import Any

from trainflow.kfp.steplog import log

WORKSPACE_MOUNT = "/kfp-workspace"
AFFINITY_MANAGER = "trainflow.dev/kfp-task-config"


def _env_from_task_config(entries: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """Pod env entries -> (plain env, secret env 'secret/key'); other valueFrom sources are skipped."""
    env: dict[str, str] = {}
    secret_env: dict[str, str] = {}
    for item in entries or []:
        name = item.get("name")
        if not name:
            continue
        if "value" in item:
            env[name] = str(item["value"])
            continue
        ref = (item.get("valueFrom") or {}).get("secretKeyRef")
        if ref and ref.get("name") and ref.get("key"):
            secret_env[name] = f"{ref['name']}/{ref['key']}"
        else:
            log(f"TaskConfig env {name!r}: only value and secretKeyRef are forwarded; skipped")
    return env, secret_env


def _volumes_from_task_config(
    volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Split TaskConfig volumes into PVC mounts (request.volumes) and other volumes (runtime patch)."""
    by_name = {v.get("name"): v for v in volumes or []}
    pvcs: list[dict[str, Any]] = []
    other_volumes: list[dict[str, Any]] = []
    other_mounts: list[dict[str, Any]] = []
    for mount in mounts or []:
        vol = by_name.get(mount.get("name"))
        if vol is None:
            continue
        claim = (vol.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            pvcs.append(
                {
                    "claim_name": claim,
                    "mount_path": mount["mountPath"],
                    "name": vol["name"],
                    "read_only": bool(mount.get("readOnly") or vol["persistentVolumeClaim"].get("readOnly")),
                    "sub_path": mount.get("subPath"),
                }
            )
        else:
            if vol not in other_volumes:
                other_volumes.append(vol)
            other_mounts.append(dict(mount))
    return pvcs, other_volumes, other_mounts


def _pod_patch(pod_spec: dict[str, Any], runtime_job: str = "node") -> dict[str, Any]:
    return {
        "manager": AFFINITY_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {"name": runtime_job, "template": {"spec": {"template": {"spec": pod_spec}}}}
                    ]
                }
            }
        },
    }


def apply_task_config(fields: dict[str, Any], task_config: Any) -> dict[str, Any]:
    """Forward a kfp ``dsl.TaskConfig`` into request fields; explicit step parameters win per key.

    resources -> resources (requests/limits); env -> env/secret_env; tolerations; node_selector;
    PVC volumes -> volumes; affinity and non-PVC volumes -> one runtime patch on the trainer pods.
    """
    if task_config is None:
        return fields
    out = dict(fields)
    resources = getattr(task_config, "resources", None)
    if resources and not out.get("resources"):
        out["resources"] = {k: v for k, v in resources.items() if k in ("requests", "limits", "claims") and v}
    env, secret_env = _env_from_task_config(getattr(task_config, "env", None) or [])
    if env:
        out["env"] = {**env, **(out.get("env") or {})}
    if secret_env:
        out["secret_env"] = {**secret_env, **(out.get("secret_env") or {})}
    tolerations = getattr(task_config, "tolerations", None)
    if tolerations:
        out["tolerations"] = [*(out.get("tolerations") or []), *tolerations]
    node_selector = getattr(task_config, "node_selector", None)
    if node_selector:
        out["node_selector"] = {**node_selector, **(out.get("node_selector") or {})}
    pvcs, other_volumes, other_mounts = _volumes_from_task_config(
        getattr(task_config, "volumes", None) or [], getattr(task_config, "volume_mounts", None) or []
    )
    if pvcs:
        known = {v.get("claim_name") for v in out.get("volumes") or []}
        out["volumes"] = [*(out.get("volumes") or []), *(p for p in pvcs if p["claim_name"] not in known)]
    pod_spec: dict[str, Any] = {}
    affinity = getattr(task_config, "affinity", None)
    if affinity:
        pod_spec["affinity"] = affinity
    if other_volumes:
        pod_spec["volumes"] = other_volumes
        pod_spec["containers"] = [{"name": "node", "volumeMounts": other_mounts}]
    if pod_spec:
        out["runtime_patches"] = [*(out.get("runtime_patches") or []), _pod_patch(pod_spec)]
    return out


def workspace_volume(task_config: Any, workspace_path: str | None) -> dict[str, Any] | None:
    """The pipeline workspace PVC (from TaskConfig volumes passthrough) as a request volume, or None."""
    if task_config is None:
        return None
    wanted = {workspace_path or WORKSPACE_MOUNT, WORKSPACE_MOUNT}
    pvcs, _, _ = _volumes_from_task_config(
        getattr(task_config, "volumes", None) or [], getattr(task_config, "volume_mounts", None) or []
    )
    for pvc in pvcs:
        if pvc["mount_path"].rstrip("/") in wanted:
            return pvc
    return None
