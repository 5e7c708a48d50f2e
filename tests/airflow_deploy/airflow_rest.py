"""A small client of Airflow's public REST API (``/api/v2``), as a user or a CI system drives a deployment."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

TERMINAL_RUN = {"success", "failed"}


class Airflow:
    """REST calls of one deployment (all-admins auth: no token needed)."""

    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        self.base = base_url.rstrip("/")
        self.http = httpx.Client(base_url=f"{self.base}/api/v2", timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        for attempt in range(5):  # the API server can be briefly busy on a loaded 2-core machine
            try:
                resp = self.http.request(method, path, **kw)
            except httpx.TransportError:
                if attempt == 4:
                    raise
                time.sleep(1 + attempt)
                continue
            if resp.status_code >= 500 and attempt < 4:
                time.sleep(1 + attempt)
                continue
            if resp.status_code >= 400:
                raise AssertionError(f"{method} {path} -> {resp.status_code}: {resp.text[:2000]}")
            return resp.json() if resp.content else None
        raise AssertionError("unreachable")

    # -- DAGs and runs -------------------------------------------------------------------------

    def wait_dag(self, dag_id: str, timeout: float = 180) -> dict[str, Any]:
        """Until the DAG processor has serialized the DAG (and it has no import error)."""

        def found() -> dict[str, Any] | None:
            errors = self._call("GET", "/importErrors")["import_errors"]
            if errors:
                raise AssertionError(f"DAG import errors: {errors}")
            resp = self.http.get(f"/dags/{dag_id}")
            return resp.json() if resp.status_code == 200 else None

        return wait_for(found, timeout, f"DAG {dag_id} to be parsed", interval=1.0)

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        self.wait_dag(dag_id)
        self._call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}}
        return self._call("POST", f"/dags/{dag_id}/dagRuns", json=body)  # type: ignore[no-any-return]

    def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")  # type: ignore[no-any-return]

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 300) -> dict[str, Any]:
        def done() -> dict[str, Any] | None:
            run = self.run(dag_id, run_id)
            return run if run["state"] in TERMINAL_RUN else None

        return wait_for(done, timeout, f"run {dag_id}/{run_id} to finish", interval=1.0)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self._call(
                "GET",
                f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
                params={"limit": 100, "offset": len(out)},
            )
            out += page["task_instances"]
            if not page["task_instances"] or len(out) >= page["total_entries"]:
                return out

    def ti(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> dict[str, Any]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        if map_index >= 0:
            path += f"/{map_index}"
        return self._call("GET", path)  # type: ignore[no-any-return]

    def wait_ti_state(
        self, dag_id: str, run_id: str, task_id: str, states: set[str], timeout: float = 180
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            ti = self.ti(dag_id, run_id, task_id)
            return ti if ti["state"] in states else None

        return wait_for(reached, timeout, f"{dag_id}/{run_id}/{task_id} in {states}", interval=0.5)

    def xcom(
        self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1
    ) -> Any:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        params: dict[str, Any] = {"deserialize": True, "stringify": False}
        if map_index >= 0:
            params["map_index"] = map_index
        return self._call("GET", path, params=params)["value"]

    def log(self, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
        """The task log of one try as text (events joined), as the UI shows it."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        params: dict[str, Any] = {"full_content": True}
        if map_index >= 0:
            params["map_index"] = map_index
        body = self._call("GET", path, params=params, headers={"Accept": "application/json"})
        content = body.get("content")
        if isinstance(content, str):
            return content
        lines = []
        for item in content or []:
            if isinstance(item, dict):
                extra = " ".join(f"{k}={v}" for k, v in item.items() if k not in ("event", "timestamp"))
                lines.append(f"{item.get('timestamp', '')} {item.get('event', '')} {extra}".strip())
            else:
                lines.append(str(item))
        return "\n".join(lines)

    def links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str | None]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/links"
        body = self._call("GET", path)
        return body.get("extra_links", body)  # type: ignore[no-any-return]

    def clear(self, dag_id: str, run_id: str, task_ids: list[str]) -> list[dict[str, Any]]:
        body = {"dry_run": False, "dag_run_id": run_id, "task_ids": task_ids, "only_failed": False}
        return self._call("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)["task_instances"]  # type: ignore[no-any-return]

    def set_ti_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """What "Mark as failed/success" in the UI does."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        self._call("PATCH", path, json={"new_state": state})

    def create_connection(self, conn_id: str, conn_type: str, extra: dict[str, Any]) -> None:
        import json

        self.http.delete(f"/connections/{conn_id}")
        self._call(
            "POST",
            "/connections",
            json={"connection_id": conn_id, "conn_type": conn_type, "extra": json.dumps(extra)},
        )

    def hook_meta(self) -> list[dict[str, Any]]:
        """What the UI's connection form is built from (the UI's own API, not the public one)."""
        resp = httpx.get(f"{self.base}/ui/connections/hook_meta", timeout=60)
        resp.raise_for_status()
        return resp.json()  # type: ignore[no-any-return]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last={last!r}")
