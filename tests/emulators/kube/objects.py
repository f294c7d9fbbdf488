"""What the parts of the Kubernetes emulator share: the objects the API server keeps (``(plural, namespace, name) ->
object``, guarded by one lock that every part takes), the ``Status`` it answers errors with, and the pods KubeRay made
for a RayCluster."""

from __future__ import annotations

import time

Objects = dict[tuple[str, str, str], dict]


def now() -> str:
    """The time as the API server writes a timestamp (RFC 3339, UTC, to the second)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def status(code: int, reason: str, message: str) -> dict:
    """A failure as the API server answers it: a ``Status`` object
    (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/status/)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def labels(obj: dict) -> dict:
    return obj.get("metadata", {}).get("labels", {})


def cluster_pods(objects: Objects, namespace: str, cluster: str) -> list[dict]:
    """The pods of RayCluster ``cluster``: those KubeRay labels ``ray.io/cluster`` with its name."""
    return [
        p
        for (plural, ns, _), p in objects.items()
        if plural == "pods" and ns == namespace and p["metadata"]["labels"].get("ray.io/cluster") == cluster
    ]
