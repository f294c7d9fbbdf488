"""What a run's cluster knew, kept in the run's store before teardown deletes the cluster (on success, failure,
Ctrl-C, a cancel or the janitor alike):

- locally, every host's Ray session logs (``logs/ray/<node>/``);
- on GKE, while the run runs, every pod it loses (a preempted or failed host's pod, which KubeRay replaces: by
  teardown it is gone), its log and last events kept as it goes (``LostPods``: ``logs/lost/``,
  ``logs/lost_pods.json``);
- on GKE, through the API server: the run's pods' statuses, the Kubernetes events about them and the RayCluster's
  status (``logs/kubernetes.json``), each Ray pod's own log (``logs/pods/<pod>.log``, and ``<pod>.previous.log`` for
  a container that restarted); the node pools' state (``logs/node_pools.json``); and through the head's dashboard
  (the service proxy), Ray's state of the cluster's nodes, its dead actors and failed tasks
  (``logs/ray_state.json``) and each node's Ray logs (``logs/ray/<node>/``, as locally).

Bounded: each file keeps at most ``CAP_BYTES``, its tail (where a failure is), and at most ``MAX_FILES`` Ray log
files are kept. Redacted: every file goes through ``components.platforms.redaction`` first (the run's Hugging Face
and Ray tokens, any bearer token), as a pod's log or an event may print a secret and the store outlives the run's
Secrets. ``tpupipe logs`` lists what the stages recorded; these files sit beside the job logs under
``logs/``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from components.platforms.redaction import redact, redact_bytes
from components.platforms.store import RunStore, read_json, write_text

CAP_BYTES = 128 * 1024
LOST_PODS = "logs/lost_pods.json"
MAX_FILES = 100  # per run, the newest: Ray writes a few files per worker process
TAIL_LINES = 5000  # of a pod's log, and of a Ray log file, asked of the server (then capped at CAP_BYTES)
# The Ray logs most telling of a failure, kept first from each node (Ray's logging docs, "Log directory":
# https://docs.ray.io/en/latest/ray-observability/user-guides/configure-logging.html); the workers' after them.
RAY_LOGS_FIRST = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "dashboard.log", "monitor.log")


class Pods(Protocol):
    """What the post-mortem reads of the run's Kubernetes objects through the API server (the gke platform's
    ``components.platforms.gke.cloud.kube.Kube``): objects as the API server answers them (JSON), a container's log."""

    def pods(self, selector: str) -> list[dict[str, Any]]: ...

    def pod_events(self) -> list[dict[str, Any]]: ...

    def get(self, kind: str, name: str) -> dict[str, Any] | None: ...

    def pod_log(self, name: str, container: str, tail_lines: int, previous: bool = False) -> str: ...


# A GET on the head's dashboard, ``get(path, params)``: its response (requests' Response, which has no type
# information here).
DashboardGet = Callable[[str, list[tuple[str, str]]], Any]


def tail(data: bytes, cap: int = CAP_BYTES) -> bytes:
    """``data`` redacted, or its last ``cap`` bytes after a line saying how much was left out."""
    data = redact_bytes(data)
    if len(data) <= cap:
        return data
    cut = data[-cap:]
    return f"[... {len(data) - cap} earlier bytes left out ...]\n".encode() + cut[cut.find(b"\n") + 1 :]


def ray_session_logs(store: RunStore, node_dirs: dict[str, Path], cap: int = CAP_BYTES) -> list[str]:
    """Each node's Ray session logs (``<temp dir>/session_latest/logs``, ``ray start --temp-dir``) into
    ``logs/ray/<node>/``, newest first up to ``MAX_FILES`` in all; the keys written."""
    files = [
        (node, path)
        for node, root in node_dirs.items()
        for path in (root / "session_latest" / "logs").glob("*")
        if path.is_file() and path.stat().st_size
    ]
    files.sort(key=lambda f: f[1].stat().st_mtime, reverse=True)
    written = []
    for node, path in files[:MAX_FILES]:
        key = f"logs/ray/{node}/{path.name}"
        store.write_bytes(key, tail(path.read_bytes(), cap), "text/plain")
        written.append(key)
    return written


def _pod(pod: dict[str, Any]) -> dict[str, Any]:
    status = pod.get("status") or {}
    return {
        "name": pod["metadata"]["name"],
        "phase": status.get("phase"),
        "node": (pod.get("spec") or {}).get("nodeName"),
        "conditions": status.get("conditions") or [],
        "containers": status.get("containerStatuses") or [],
    }


def kubernetes(store: RunStore, kube: Pods, selector: str, raycluster: str) -> str:
    """The run's pods (phase, node, conditions, container states: restarts, last termination), the events about
    them, and its RayCluster's status, as ``logs/kubernetes.json``; its key."""
    pods = kube.pods(selector)
    names = {p["metadata"]["name"] for p in pods}
    events = [
        {k: e.get(k) for k in ("type", "reason", "message", "count", "lastTimestamp")}
        | {"pod": e["involvedObject"]["name"]}
        for e in kube.pod_events()
        if e.get("involvedObject", {}).get("name") in names
    ]
    cluster = kube.get("RayCluster", raycluster) or {}
    doc = {"pods": [_pod(p) for p in pods], "events": events[-500:], "raycluster": cluster.get("status")}
    return _write_json(store, "logs/kubernetes.json", doc)


def pod_logs(store: RunStore, kube: Pods, pods: list[dict[str, Any]], cap: int = CAP_BYTES) -> list[str]:
    """Each started container's log of the run's pods (the API server's "read log" of a pod, its last
    ``TAIL_LINES`` lines), and the previous container's of one that restarted, as ``logs/pods/<pod>[.<container>]
    [.previous].log``; the keys written. A pod whose container never started has no log (its status says why)."""
    written = []
    for pod in pods:
        name = pod["metadata"]["name"]
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for status in statuses:
            container = status["name"]
            stem = name if len(statuses) == 1 else f"{name}.{container}"
            state = status.get("state") or {}
            wanted = [(False, "")] if state.get("running") or state.get("terminated") else []
            wanted += [(True, ".previous")] if status.get("restartCount") else []
            for previous, suffix in wanted:
                text = kube.pod_log(name, container, tail_lines=TAIL_LINES, previous=previous)
                key = f"logs/pods/{stem}{suffix}.log"
                store.write_bytes(key, tail(text.encode(), cap), "text/plain")
                written.append(key)
    return written


def node_pools(store: RunStore, pools: list[dict[str, Any]]) -> str:
    """The run's node pools as GKE describes them (status and its message, conditions, autoscaling, the nodes'
    machine, spot or flex-start), as ``logs/node_pools.json``; its key."""
    return _write_json(store, "logs/node_pools.json", pools)


def _listed(get: DashboardGet, path: str, state: str = "") -> list[dict[str, Any]]:
    """The rows of a State API list (``GET /api/v0/<resource>``, detail on, filtered on ``state``): its answer is
    ``{"data": {"result": {"result": [...]}}}`` (ray ``dashboard/state_api_utils.py``, ``handle_list_api``)."""
    params = [("detail", "true"), ("limit", "1000")]
    if state:
        params += [("filter_keys", "state"), ("filter_predicates", "="), ("filter_values", state)]
    rows: list[dict[str, Any]] = get(path, params).json()["data"]["result"]["result"]
    return rows


def node_label(node: dict[str, Any]) -> str:
    """A Ray node's name in the post-mortem: its host label where the platform gives one, "head", else its IP."""
    labels = node.get("labels") or {}
    return labels.get("tpupipe/host") or ("head" if node.get("is_head_node") else node.get("node_ip", node["node_id"]))


def ray_state(store: RunStore, get: DashboardGet, cap: int = CAP_BYTES) -> list[str]:
    """Through the head's dashboard (``get(path, params)`` -> a response): the cluster's nodes, its dead actors (their
    death causes) and failed tasks (their errors), from Ray's State API
    (https://docs.ray.io/en/latest/ray-observability/reference/api.html), as ``logs/ray_state.json``; then each
    live node's Ray logs (the State API's ``/api/v0/logs`` lists a node's files, ``/api/v0/logs/file`` gives one's
    last lines), the telling ones first (``RAY_LOGS_FIRST``), into ``logs/ray/<node>/``; the keys written."""
    nodes = _listed(get, "/api/v0/nodes")
    doc = {
        "nodes": nodes,
        "dead_actors": _listed(get, "/api/v0/actors", "DEAD"),
        "failed_tasks": _listed(get, "/api/v0/tasks", "FAILED"),
    }
    written = [_write_json(store, "logs/ray_state.json", doc)]
    wanted = []
    for node in nodes:
        if node.get("state") != "ALIVE":
            continue
        listing = get("/api/v0/logs", [("node_id", node["node_id"])]).json()["data"]["result"]
        files = sorted({f for names in listing.values() for f in names if not f.endswith("/")})  # no folders
        files.sort(key=lambda f: RAY_LOGS_FIRST.index(f) if f in RAY_LOGS_FIRST else len(RAY_LOGS_FIRST))
        wanted += [(i, node, f) for i, f in enumerate(files)]
    wanted.sort(key=lambda w: w[0])  # round-robin over the nodes, so that every node keeps its telling logs
    for _, node, filename in wanted[:MAX_FILES]:
        params = [("node_id", node["node_id"]), ("filename", filename), ("lines", str(TAIL_LINES))]
        key = f"logs/ray/{node_label(node)}/{filename.rsplit('/', 1)[-1]}"
        try:  # one file the node cannot give (gone, unreadable) costs that file alone
            content = get("/api/v0/logs/file", params).content
        except Exception as exc:  # noqa: BLE001 - a post-mortem keeps what it can
            content = f"(not kept: {str(exc)[:300]})\n".encode()
        store.write_bytes(key, tail(content, cap), "text/plain")
        written.append(key)
    return written


class LostPods:
    """The pods a run loses while it runs, kept as they go: ``observe(pods)`` takes the run's pods each time they are
    read (a Kubernetes pod dict each). A pod going away (``metadata.deletionTimestamp`` set: its node preempted or
    repaired, the pod deleted; or its phase Failed) has its containers' logs and its events kept at once, as
    ``logs/lost/<pod>.<uid>.log``; a container that restarted in place, its previous container's log; a pod that was
    gone before it could be read (between two observations), its last status seen. ``logs/lost_pods.json`` lists
    them all, in order. ``kube``: what reads a pod's log and the pods' events (``pod_log``, ``pod_events``)."""

    def __init__(self, store: RunStore, kube: Pods, cap: int = CAP_BYTES) -> None:
        self.store, self.kube, self.cap = store, kube, cap
        self.seen: dict[str, dict[str, Any]] = {}  # uid (else name) -> the pod as last seen
        # what an earlier stage's process kept (each stage may run in its own: on Vertex AI, one task each)
        self.kept: list[dict[str, Any]] = list(read_json(store, LOST_PODS) or [])
        self._done: set[tuple[str, int]] = {(k["uid"], -1) for k in self.kept}  # (uid, restarts) already kept

    def observe(self, pods: list[dict[str, Any]]) -> None:
        now = {_uid(p): p for p in pods}
        before = len(self.kept)
        for uid, pod in now.items():
            restarts = sum(c.get("restartCount") or 0 for c in (pod.get("status") or {}).get("containerStatuses") or [])
            if _going(pod) and (uid, -1) not in self._done:
                self._keep(pod, "lost: " + _why(pod), previous=False, mark=(uid, -1))
            elif restarts and (uid, restarts) not in self._done and uid in self.seen:
                self._keep(pod, f"its container restarted ({restarts})", previous=True, mark=(uid, restarts))
        for uid, pod in self.seen.items():
            if uid not in now and (uid, -1) not in self._done:
                self._done.add((uid, -1))
                self.kept.append({**_pod(pod), "uid": uid, "why": "gone before it could be read", "log": None})
        self.seen = now
        if len(self.kept) > before:
            _write_json(self.store, LOST_PODS, self.kept)

    def _keep(self, pod: dict[str, Any], why: str, previous: bool, mark: tuple[str, int]) -> None:
        self._done.add(mark)
        name, uid = pod["metadata"]["name"], mark[0]
        parts = []
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            try:  # a pod already half gone may give nothing: what it gives is kept
                text = self.kube.pod_log(name, status["name"], tail_lines=TAIL_LINES, previous=previous)
            except Exception as exc:  # noqa: BLE001 - a post-mortem keeps what it can
                text = f"(not kept: {str(exc)[:300]})\n"
            parts.append(f"--- container {status['name']}{' (previous)' if previous else ''} ---\n{text}")
        key = f"logs/lost/{name}.{uid[:12]}.log"
        self.store.write_bytes(key, tail("".join(parts).encode(), self.cap), "text/plain")
        try:
            events = [
                {k: e.get(k) for k in ("type", "reason", "message", "count", "lastTimestamp")}
                for e in self.kube.pod_events()
                if (e.get("involvedObject") or {}).get("name") == name
            ][-50:]
        except Exception as exc:  # noqa: BLE001
            events = [{"error": str(exc)[:300]}]
        self.kept.append({**_pod(pod), "uid": uid, "why": why, "log": key, "events": events})


def _write_json(store: RunStore, key: str, doc: Any) -> str:
    """``doc`` as JSON under ``key``, redacted (an event's message, a task's error may quote a secret)."""
    return write_text(store, key, redact(json.dumps(doc, indent=1, default=str)), "application/json")


def _uid(pod: dict[str, Any]) -> str:
    uid: str = pod["metadata"].get("uid") or pod["metadata"]["name"]
    return uid


def _going(pod: dict[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp")) or (pod.get("status") or {}).get("phase") == "Failed"


def _why(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    said = ": ".join(x for x in (status.get("reason"), status.get("message")) if x)
    return said or ("being deleted" if pod["metadata"].get("deletionTimestamp") else status.get("phase", ""))
