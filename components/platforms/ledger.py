"""The run's ledger: one JSON document per run (``ledger.json`` in its store) recording everything the run created,
written before anything waits on it, so teardown — a later task, a retried one, or ``tpupipe teardown`` — finds
exactly what to delete. Both platforms keep theirs here: the local platform records the processes it started
(``processes``) and its cluster's GCS address (``gcs_address``), the gke platform the cloud resources (``created``:
``{kind, name}`` in creation order).

Several writers share a run's ledger (a stage's task and the local host keeper, a retried task, teardown, the
janitor), so every change is a read-modify-write under a generation precondition (:func:`update`): a writer that
lost the race reads the ledger again and applies its change to what the other wrote, so no change is lost."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from components.platforms.store import RunStore, StoreConflict, read_json, write_json

KEY = "ledger.json"
ATTEMPTS = 20  # read-modify-writes a change is tried in before the conflict is raised


def load(store: RunStore) -> dict[str, Any] | None:
    """The run's ledger, or None when the run recorded nothing yet."""
    ledger: dict[str, Any] | None = read_json(store, KEY)  # a JSON object, as update writes it
    return ledger


def update(
    store: RunStore, change: Callable[[dict[str, Any]], bool | None], empty: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Apply ``change`` to the ledger (``empty``, or ``{}``, when there is none yet) and write it whole, on the
    condition that nobody wrote it since it was read; when someone did, read it again and apply ``change`` again.
    ``change`` returns False when it has nothing to change (nothing is written). The ledger as written (or read)."""
    for attempt in range(1, ATTEMPTS + 1):
        text, generation = store.read_versioned(KEY)
        # A copy (change may mutate it) of the JSON object the ledger is.
        ledger: dict[str, Any] = json.loads(text if text is not None else json.dumps(empty or {}))
        if change(ledger) is False:
            return ledger
        try:
            write_json(store, KEY, ledger, generation)
            return ledger
        except StoreConflict:
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def gcs_address(store: RunStore) -> str | None:
    """The GCS address of the run's own Ray cluster where its ledger records one: the local platform's, whose clusters
    share this machine with other runs' (KubeRay sets ``RAY_ADDRESS`` in every Ray container of a RayCluster:
    https://github.com/ray-project/kuberay, ray-operator/controllers/ray/common/pod.go)."""
    address: str | None = (load(store) or {}).get("gcs_address")
    return address


# Who holds the run's id (``components.stages.claims``): kept when the ledger is written afresh.
CLAIM_KEYS = ("claim", "pipeline_job")
# Where a run id is also claimed beside resources named from it within a bucket (``Platform.claims_store``).
RESOURCE_CLAIMS = "state/_claims"


def replace(store: RunStore, ledger: dict[str, Any]) -> dict[str, Any]:
    """Write ``ledger`` whole in place of what is stored (a run starting afresh), as :func:`update` writes; the run's
    claim on its id is kept."""

    def whole(stored: dict[str, Any]) -> None:
        kept = {key: stored[key] for key in CLAIM_KEYS if key in stored}
        stored.clear()
        stored.update(ledger | kept)

    return update(store, whole)


def recorder(store: RunStore, ledger: dict[str, Any]) -> Callable[[str, str], None]:
    """``record(kind, name)``: append a created resource to the stored ledger's ``created`` (once) at once, and
    refresh ``ledger`` (the caller's copy) from what was written."""

    def record(kind: str, name: str) -> None:
        def add(stored: dict[str, Any]) -> bool:
            created = stored.setdefault("created", [])
            if any(e["kind"] == kind and e["name"] == name for e in created):
                return False
            created.append({"kind": kind, "name": name})
            return True

        written = update(store, add, ledger)
        ledger.clear()
        ledger.update(written)

    return record
