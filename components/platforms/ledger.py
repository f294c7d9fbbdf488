"""The run's ledger: one JSON document per run (``<run dir>/ledger.json``) recording everything the run created,
written before anything waits on it, so teardown — a later task, a retried one, or ``tpupipe teardown`` — finds
exactly what to delete. Both platforms keep theirs here: the local platform records the processes it started
(``processes``), the gke platform the cloud resources (``created``: ``{kind, name}`` in creation order)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

FILE_NAME = "ledger.json"


def load(path: Path) -> dict[str, Any] | None:
    """The ledger at ``path``, or None when the run recorded nothing yet."""
    return json.loads(path.read_text()) if path.is_file() else None


def save(path: Path, ledger: dict[str, Any]) -> None:
    """Write atomically: a reader (the host keeper, a teardown) never sees half a ledger."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(ledger, indent=2))
    tmp.replace(path)


def recorder(path: Path, ledger: dict[str, Any]) -> Callable[[str, str], None]:
    """``record(kind, name)``: append a created resource to ``ledger['created']`` (once) and save at once."""

    def record(kind: str, name: str) -> None:
        created = ledger.setdefault("created", [])
        if not any(e["kind"] == kind and e["name"] == name for e in created):
            created.append({"kind": kind, "name": name})
            save(path, ledger)

    return record
