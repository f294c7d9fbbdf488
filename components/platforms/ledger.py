"""The run's ledger: one JSON document per run (``ledger.json`` in its store) recording everything the run created,
written before anything waits on it, so teardown — a later task, a retried one, or ``tpupipe teardown`` — finds
exactly what to delete. Both platforms keep theirs here: the local platform records the processes it started
(``processes``) and its cluster's GCS address (``gcs_address``), the gke platform the cloud resources (``created``:
``{kind, name}`` in creation order)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.platforms.store import RunStore, read_json, write_json

KEY = "ledger.json"


def load(store: RunStore) -> dict[str, Any] | None:
    """The run's ledger, or None when the run recorded nothing yet."""
    return read_json(store, KEY)


def save(store: RunStore, ledger: dict[str, Any]) -> None:
    """Write it whole: a reader (the host keeper, a teardown) never sees half a ledger."""
    write_json(store, KEY, ledger)


def gcs_address(store: RunStore) -> str | None:
    """The GCS address of the run's own Ray cluster where its ledger records one: the local platform's, whose clusters
    share this machine with other runs' (KubeRay sets ``RAY_ADDRESS`` in every Ray container of a RayCluster:
    https://github.com/ray-project/kuberay, ray-operator/controllers/ray/common/pod.go)."""
    return (load(store) or {}).get("gcs_address")


def recorder(store: RunStore, ledger: dict[str, Any]) -> Callable[[str, str], None]:
    """``record(kind, name)``: append a created resource to ``ledger['created']`` (once) and save at once."""

    def record(kind: str, name: str) -> None:
        created = ledger.setdefault("created", [])
        if not any(e["kind"] == kind and e["name"] == name for e in created):
            created.append({"kind": kind, "name": name})
            save(store, ledger)

    return record
