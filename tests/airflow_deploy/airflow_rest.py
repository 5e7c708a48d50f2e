"""A small client of Airflow's public REST API, as a user or a CI system drives a deployment: ``/api/v2`` on
Airflow 3, ``/api/v1`` on Airflow 2 (the same calls; where the two differ, the method says how)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import httpx

TERMINAL_RUN = {"success", "failed"}
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL|Traceback|[A-Za-z]+(Error|Exception|Failed))\b")


def first_error(log: str) -> str:
    """A failed try's first error line (what an assertion about it should say first, as CI shows only a line)."""
    lines = log.splitlines()
    hit = next((line for line in lines if ERROR_LINE.search(line)), lines[-1] if lines else "(empty log)")
    return hit.strip()[:300]


class Airflow:
    """REST calls of one deployment (all-admins auth on 3.x, an Admin public role on 2.x: no token needed)."""

    def __init__(self, base_url: str, timeout: float = 60.0, major: int = 3) -> None:
        self.base = base_url.rstrip("/")
        self.major = major
        self.http = httpx.Client(base_url=f"{self.base}/api/{'v2' if major >= 3 else 'v1'}", timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = self._request(method, path, **kw)
        return resp.json() if resp.content else None

    def _text(self, method: str, path: str, **kw: Any) -> str:
        return self._request(method, path, **kw).text

    def _request(self, method: str, path: str, **kw: Any) -> httpx.Response:
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
            return resp
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
        body: dict[str, Any] = {"dag_run_id": run_id, "conf": conf or {}}
        if self.major >= 3:
            body["logical_date"] = None  # a run without a logical date, as the UI's trigger makes (3.x only)
        return self._call("POST", f"/dags/{dag_id}/dagRuns", json=body)  # type: ignore[no-any-return]

    def runs(self, dag_id: str) -> list[dict[str, Any]]:
        """The DAG's runs (its first 100), whoever started them: the scheduler's as well as the tests'."""
        return self._call("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"]  # type: ignore[no-any-return]

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
        if self.major < 3:  # 2.x: the whole log as text (its JSON form is one log chunk)
            return self._text("GET", path, params=params, headers={"Accept": "text/plain"})
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

    def why(self, dag_id: str, run_id: str, task_id: str = "train", map_index: int = -1) -> str:
        """Why a run did not succeed, in a line: the tasks that ran and did not succeed first (the cause, with
        try and first log error), then the given task, then the rest that did not succeed (an upstream failure
        leaves a task never tried), so a cut message still names the cause."""
        tis = {(t["task_id"], t.get("map_index", -1)): t for t in self.task_instances(dag_id, run_id)}
        ti = tis.get((task_id, map_index)) or self.ti(dag_id, run_id, task_id, map_index)
        others = [
            t
            for key, t in sorted(tis.items())
            if key != (task_id, map_index) and t.get("state") not in ("success", "skipped")
        ]
        ran = [t for t in others if int(t.get("try_number") or 0) >= 1]
        parts = [self._try_line(dag_id, run_id, t) for t in ran]
        parts.append(self._try_line(dag_id, run_id, ti))
        parts += [self._try_line(dag_id, run_id, t) for t in others if t not in ran]
        return "; ".join(parts)

    def _try_line(self, dag_id: str, run_id: str, ti: dict[str, Any]) -> str:
        tries = int(ti.get("try_number") or 0)
        head = f"{ti['task_id']} {ti.get('state')} on try {tries}"
        if tries < 1:
            return f"{head} (never ran)"
        try:
            log = self.log(dag_id, run_id, ti["task_id"], tries, int(ti.get("map_index", -1)))
        except AssertionError as err:  # the log endpoint's own refusal, said instead of the log
            return f"{head}: no log ({str(err)[:200]})"
        return f"{head}: {first_error(log)}"

    def state_store(self, dag_id: str, run_id: str, task_id: str, key: str) -> Any:
        """One entry of a task instance's task state store (Airflow >= 3.3), its value; None when not set."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/state-store/{key}"
        try:
            return self._call("GET", path)["value"]
        except AssertionError as err:
            if f"{path} -> 404" in str(err):
                return None
            raise

    def links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, str | None]:
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/links"
        body = self._call("GET", path)
        return body.get("extra_links", body)  # type: ignore[no-any-return]

    def clear(self, dag_id: str, run_id: str, task_ids: list[str]) -> list[dict[str, Any]]:
        body = {"dry_run": False, "dag_run_id": run_id, "task_ids": task_ids, "only_failed": False}
        return self._call("POST", f"/dags/{dag_id}/clearTaskInstances", json=body)["task_instances"]  # type: ignore[no-any-return]

    def set_ti_state(self, dag_id: str, run_id: str, task_id: str, state: str) -> None:
        """What "Mark as failed/success" in the UI does (2.x defaults to a dry run)."""
        path = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        self._call("PATCH", path, json={"new_state": state, **({"dry_run": False} if self.major < 3 else {})})

    def create_connection(self, conn_id: str, conn_type: str, extra: dict[str, Any]) -> None:
        import json

        self.http.delete(f"/connections/{conn_id}")
        self._call(
            "POST",
            "/connections",
            json={"connection_id": conn_id, "conn_type": conn_type, "extra": json.dumps(extra)},
        )

    def asset_events(self, run_id: str) -> list[dict[str, Any]]:
        """The asset (2.x: dataset) events a run produced, each with its ``uri``."""
        if self.major >= 3:
            return self._call("GET", "/assets/events", params={"source_run_id": run_id})["asset_events"]  # type: ignore[no-any-return]
        events = self._call("GET", "/datasets/events", params={"source_run_id": run_id})["dataset_events"]
        return [{**e, "uri": e["dataset_uri"]} for e in events]

    def connection_form_fields(self, conn_type: str) -> set[str]:
        """The extra fields the UI's connection form shows for ``conn_type``: 3.x from the React UI's
        ``hook_meta``, 2.x from the Flask form's HTML (its inputs are named ``extra__<type>__<field>``)."""
        prefix = f"extra__{conn_type}__"
        if self.major >= 3:
            meta = {m["connection_type"]: m for m in self.hook_meta()}
            assert conn_type in meta, sorted(meta)
            return {k.removeprefix(prefix) for k in meta[conn_type]["extra_fields"] or {}}
        import re

        resp = httpx.get(f"{self.base}/connection/add", timeout=60, follow_redirects=True)
        resp.raise_for_status()
        return set(re.findall(rf'name="{prefix}(\w+)"', resp.text))

    def hook_meta(self) -> list[dict[str, Any]]:
        """What the 3.x UI's connection form is built from (the UI's own API, not the public one)."""
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
