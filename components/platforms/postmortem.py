"""What a run's cluster knew, kept in the run's store before teardown deletes the cluster (on success, failure,
Ctrl-C or a cancel alike): the local hosts' Ray session logs; on GKE the run's pods' statuses, the Kubernetes events
about them and the RayCluster's status. Bounded: each file keeps at most ``CAP_BYTES``, its tail (where a failure is).
``tpupipe logs`` lists what the stages recorded; these files sit beside the job logs under ``logs/``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components.platforms.store import RunStore, write_text

CAP_BYTES = 128 * 1024
MAX_FILES = 100  # per run, the newest: Ray writes a few files per worker process


def tail(data: bytes, cap: int = CAP_BYTES) -> bytes:
    """``data``, or its last ``cap`` bytes after a line saying how much was left out."""
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


def kubernetes(store: RunStore, kube, selector: str, raycluster: str) -> str:
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
    return write_text(store, "logs/kubernetes.json", json.dumps(doc, indent=1, default=str), "application/json")
