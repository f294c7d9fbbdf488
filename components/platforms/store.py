"""Where a run's state lives: ``<output root>/<run id>/`` on this machine, or ``gs://BUCKET/PREFIX/<run id>/`` in Cloud
Storage, behind one small interface (:class:`RunStore`) keyed by paths inside the run (``stages/train.json``,
``ledger.json``, ``logs/train.log``, ``summary.json``, ``loss.png``).

On Vertex AI every task is its own container on its own machine: nothing a later task needs may stay on a task's
disk. The store writes through the Cloud Storage client rather than the ``/gcs/`` mount Vertex provides: the same
code then works from a workstation (``tpupipe run --platform gke``), in every task, and against the storage
emulator in tests; and each write is one whole object, so a reader never sees half a record (the FUSE mount gives
no such guarantee for read-modify-write of the ledger).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from components.spec import SpecError


class RunStore(Protocol):
    uri: str  # the run's directory: a local path, or gs://bucket/prefix/<run id>

    def read_text(self, key: str) -> str | None: ...

    def write_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str: ...

    def exists(self, key: str) -> bool: ...

    def local(self) -> Path | None:
        """The run's directory on this machine, or None when the run lives in Cloud Storage."""


def write_text(store: RunStore, key: str, text: str, content_type: str = "text/plain") -> str:
    return store.write_bytes(key, text.encode(), content_type)


def read_json(store: RunStore, key: str) -> Any:
    text = store.read_text(key)
    return None if text is None else json.loads(text)


def write_json(store: RunStore, key: str, value: Any) -> str:
    return write_text(store, key, json.dumps(value, indent=2, sort_keys=True), "application/json")


class LocalStore:
    def __init__(self, root: Path):
        self.root = root
        self.uri = str(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def read_text(self, key: str) -> str | None:
        path = self.path(key)
        return path.read_text() if path.is_file() else None

    def write_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # whole or nothing, like an object write
        tmp.write_bytes(data)
        tmp.replace(path)
        return str(path)

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def local(self) -> Path:
        return self.root


class GcsStore:
    def __init__(self, bucket: str, prefix: str, client=None):
        self.bucket_name, self.prefix = bucket, prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}"
        self._client = client

    def _bucket(self):
        if self._client is None:
            self._client = gcs_client()
        return self._client.bucket(self.bucket_name)

    def _blob(self, key: str):
        return self._bucket().blob(f"{self.prefix}/{key}")

    def read_text(self, key: str) -> str | None:
        from google.api_core import exceptions as gexc

        try:
            return self._blob(key).download_as_text()
        except gexc.NotFound:
            return None

    def write_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        self._blob(key).upload_from_string(data, content_type=content_type)
        return f"{self.uri}/{key}"

    def exists(self, key: str) -> bool:
        return self._blob(key).exists()

    def local(self) -> None:
        return None


def gcs_client():
    from google.cloud import storage

    from components.platforms.credentials import credentials

    return storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or None, credentials=credentials())


def runs_with(output_root: str, key: str) -> list[str]:
    """The ids of the runs under ``output_root`` whose directory holds ``key`` (``ledger.json``), sorted: one listing
    of ``gs://BUCKET/PREFIX/*/KEY``, or of the local directory."""
    root = output_root or "runs"
    open_store(root, "_")  # a root no run's store could be under is the same SpecError
    if root.startswith("gs://"):
        bucket, _, prefix = root.removeprefix("gs://").partition("/")
        prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        blobs = gcs_client().list_blobs(bucket, prefix=prefix, match_glob=f"{prefix}*/{key}")
        return sorted(b.name[len(prefix) :].split("/", 1)[0] for b in blobs)
    path = Path(root).expanduser().resolve()
    return sorted(p.parent.name for p in path.glob(f"*/{key}")) if path.is_dir() else []


def open_store(output_root: str, run_id: str) -> RunStore:
    """The store of run ``run_id`` under ``output_root``: ``gs://BUCKET[/PREFIX]`` or a local directory (default
    ``./runs``)."""
    root = output_root or "runs"
    if root.startswith("gs://"):
        bucket, _, prefix = root.removeprefix("gs://").partition("/")
        if not bucket:
            raise SpecError("output_root", f"{root!r} names no bucket", ["gs://BUCKET/PREFIX", "a local directory"])
        return GcsStore(bucket, f"{prefix.strip('/')}/{run_id}" if prefix.strip("/") else run_id)
    if "://" in root:
        raise SpecError(
            "output_root",
            f"{root!r}: only gs:// and local directories hold runs",
            ["gs://BUCKET/PREFIX", "a local directory"],
        )
    return LocalStore(Path(root).expanduser().resolve() / run_id)
