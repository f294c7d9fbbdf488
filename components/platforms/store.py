"""Where a run's state lives: ``<output root>/<run id>/`` on this machine, or ``gs://BUCKET/PREFIX/<run id>/`` in Cloud
Storage, behind one small interface (:class:`RunStore`) keyed by paths inside the run (``stages/train.json``,
``ledger.json``, ``logs/train.log``, ``summary.json``, ``loss.png``).

On Vertex AI every task is its own container on its own machine: nothing a later task needs may stay on a task's
disk. The store writes through the Cloud Storage client rather than the ``/gcs/`` mount Vertex provides: the same
code then works from a workstation (``tpupipe run --platform gke``), in every task, and against the storage
emulator in tests; and each write is one whole object, so a reader never sees half a record (the FUSE mount gives
no such guarantee for read-modify-write of the ledger).

A read-modify-write (the ledger's, ``components/platforms/ledger.py``) is made safe by a generation precondition, as
Cloud Storage offers it: :meth:`RunStore.read_versioned` answers a key's text with its generation (0: no such key),
and a write given ``if_generation`` takes effect only while the key still has that generation, else raises
:class:`StoreConflict` and writes nothing ("Request preconditions",
https://cloud.google.com/storage/docs/request-preconditions: ``ifGenerationMatch``, 0 meaning "only if no live
object"). On this machine a lock file beside the key plays it: held by every write and versioned read, it holds the
key's count of writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from components.spec import SpecError

if TYPE_CHECKING:
    from google.cloud import storage


class StoreConflict(Exception):
    """A write's generation precondition did not hold: another writer changed the key since it was read."""


class RunStore(Protocol):
    uri: str  # the run's directory: a local path, or gs://bucket/prefix/<run id>

    def read_text(self, key: str) -> str | None: ...

    def read_bytes(self, key: str) -> bytes | None: ...

    def read_versioned(self, key: str) -> tuple[str | None, int]:
        """The key's text (None when absent) and its generation (0 when absent)."""

    def write_bytes(
        self, key: str, data: bytes, content_type: str = "application/octet-stream", if_generation: int | None = None
    ) -> str: ...

    def write_file(self, key: str, path: str, content_type: str = "application/octet-stream") -> str:
        """The local file ``path`` as ``key``, streamed (never held whole in memory)."""

    def exists(self, key: str) -> bool: ...

    def local(self) -> Path | None:
        """The run's directory on this machine, or None when the run lives in Cloud Storage."""


def write_text(
    store: RunStore, key: str, text: str, content_type: str = "text/plain", if_generation: int | None = None
) -> str:
    return store.write_bytes(key, text.encode(), content_type, if_generation)


def read_json(store: RunStore, key: str) -> Any:
    text = store.read_text(key)
    return None if text is None else json.loads(text)


def write_json(store: RunStore, key: str, value: Any, if_generation: int | None = None) -> str:
    """``value`` as JSON, on ``if_generation``'s condition when given (:meth:`RunStore.write_bytes`)."""
    return write_text(store, key, json.dumps(value, indent=2, sort_keys=True), "application/json", if_generation)


class LocalStore:
    def __init__(self, root: Path):
        self.root = root
        self.uri = str(root)

    def path(self, key: str) -> Path:
        return self.root / key

    def read_text(self, key: str) -> str | None:
        path = self.path(key)
        return path.read_text() if path.is_file() else None

    def read_bytes(self, key: str) -> bytes | None:
        path = self.path(key)
        return path.read_bytes() if path.is_file() else None

    def read_versioned(self, key: str) -> tuple[str | None, int]:
        with self._locked(key) as lock:
            text = self.read_text(key)
            return text, 0 if text is None else _count(lock)

    def write_bytes(
        self, key: str, data: bytes, content_type: str = "application/octet-stream", if_generation: int | None = None
    ) -> str:
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = path.with_name(f".{path.name}.lock")
        if if_generation is None and not lock_file.exists():  # a key never written conditionally
            _replace(path, data)
            return str(path)
        with self._locked(key) as lock:
            generation = _count(lock) if path.is_file() else 0
            if if_generation is not None and generation != if_generation:
                raise StoreConflict(f"{path} changed since it was read")
            _replace(path, data)
            lock.seek(0)
            lock.truncate()
            lock.write(str(generation + 1))
            lock.flush()
        return str(path)

    def write_file(self, key: str, path: str, content_type: str = "application/octet-stream") -> str:
        import shutil

        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        shutil.copyfile(path, tmp)
        tmp.replace(target)
        return str(target)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[IO[str]]:
        """The key's lock file (beside it), held by one conditional writer or versioned reader at a time; it holds the
        key's generation (a key read-modify-written is written only conditionally: the ledger)."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f".{path.name}.lock"), "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield lock

    def exists(self, key: str) -> bool:
        return self.path(key).exists()

    def local(self) -> Path:
        return self.root


class GcsStore:
    def __init__(self, bucket: str, prefix: str, client: storage.Client | None = None) -> None:
        self.bucket_name, self.prefix = bucket, prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}"
        self._client = client

    def _bucket(self) -> storage.Bucket:
        if self._client is None:
            self._client = gcs_client()
        return self._client.bucket(self.bucket_name)

    def _blob(self, key: str) -> storage.Blob:
        return self._bucket().blob(f"{self.prefix}/{key}")

    def read_text(self, key: str) -> str | None:
        from google.api_core import exceptions as gexc

        try:
            text: str = self._blob(key).download_as_text()
        except gexc.NotFound:
            return None
        return text

    def read_bytes(self, key: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        try:
            data: bytes = self._blob(key).download_as_bytes()
        except gexc.NotFound:
            return None
        return data

    def read_versioned(self, key: str) -> tuple[str | None, int]:
        from google.api_core import exceptions as gexc

        blob = self._blob(key)
        try:
            text = blob.download_as_text()  # the client takes the generation from the response (x-goog-generation)
        except gexc.NotFound:
            return None, 0
        return text, int(blob.generation)

    def write_bytes(
        self, key: str, data: bytes, content_type: str = "application/octet-stream", if_generation: int | None = None
    ) -> str:
        from google.api_core import exceptions as gexc

        try:
            self._blob(key).upload_from_string(data, content_type=content_type, if_generation_match=if_generation)
        except gexc.PreconditionFailed as exc:
            raise StoreConflict(f"{self.uri}/{key} changed since it was read") from exc
        return f"{self.uri}/{key}"

    def write_file(self, key: str, path: str, content_type: str = "application/octet-stream") -> str:
        self._blob(key).upload_from_filename(path, content_type=content_type)  # in chunks, resumable when large
        return f"{self.uri}/{key}"

    def exists(self, key: str) -> bool:
        return bool(self._blob(key).exists())

    def local(self) -> None:
        return None


def _replace(path: Path, data: bytes) -> None:
    """Write the file whole or not at all, like an object write."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _count(lock: IO[str]) -> int:
    """The generation a key's lock file holds (1 for a file written before it had one)."""
    lock.seek(0)
    text = lock.read().strip()
    return int(text) if text.isdigit() else 1


def gcs_client() -> storage.Client:
    from components.cloud.credentials import storage_client

    return storage_client(os.environ.get("GOOGLE_CLOUD_PROJECT") or None)


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


def at(uri: str) -> tuple[RunStore, str]:
    """The store holding the file ``uri`` names (``gs://BUCKET/PREFIX/NAME``, or a path on this machine) and its key
    there: how a stage reads what the run's jobs wrote (``Platform.checkpoint_uri`` of their path) or what another
    run's stage kept, through the same layer as its own state, in whichever task and machine it runs."""
    if uri.startswith("gs://"):
        bucket, _, name = uri.removeprefix("gs://").partition("/")
        prefix, _, key = name.rpartition("/")
        if not bucket or not prefix or not key:
            raise ValueError(f"{uri!r} names no object under a prefix of a bucket (gs://BUCKET/PREFIX/NAME)")
        return GcsStore(bucket, prefix), key
    if "://" in uri or not uri:
        raise ValueError(f"{uri!r}: only gs:// objects and paths on this machine are read")
    path = Path(uri)
    return LocalStore(path.parent), path.name


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
