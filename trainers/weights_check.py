"""Base weights checked at load, by the worker: the bytes it loads are the bytes the trusted side verified.

The train stage (the pipeline's identity) copies a hub model into the shared cache and records each file's hub hash
in a trusted manifest (``components.workload.weights``); the run's jobs get the copy's directory
(``TPUPIPE_WEIGHTS_DIR``) and that manifest's files (``TPUPIPE_WEIGHTS_MANIFEST``) in their definition, which no pod
writes. The copy itself is read through a mount (GCS FUSE on gke) whose objects can change between the stage's check
and a worker's read, and whatever a loader reads twice could differ between the reads. So a worker reads each listed
file once, hashing the bytes as they stream (an LFS file's sha256, any other file's git blob sha1: the hashes the
hub reports, https://huggingface.co/docs/huggingface_hub/package_reference/hf_api, ``RepoSibling.blob_id`` and
``lfs.sha256``) into a directory of its own, and loads from there only when every file matched: a mismatch refuses
the load, naming the file. Files the manifest does not list are not copied, so never loaded.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

WEIGHTS_DIR_ENV = "TPUPIPE_WEIGHTS_DIR"  # components.workload.weights.WEIGHTS_DIR_ENV
MANIFEST_ENV = "TPUPIPE_WEIGHTS_MANIFEST"  # components.workload.weights.WEIGHTS_MANIFEST_ENV
CHUNK = 1 << 20


class WeightsRefused(RuntimeError):
    """A file of the cached base weights is not what the trusted manifest says: the load is refused."""


def _digest(entry: dict[str, Any]) -> tuple[Any, str, str]:
    """A fresh hash of the kind the hub keeps for the file, the value it must reach, and the kind's name. A git
    blob's id hashes ``blob <size>\\0`` first (https://git-scm.com/book/en/v2/Git-Internals-Git-Objects): the
    manifest's size, so bytes of another length cannot match."""
    if "sha256" in entry:
        return hashlib.sha256(), str(entry["sha256"]), "sha256"
    return hashlib.sha1(b"blob %d\0" % int(entry["size"])), str(entry["git_sha1"]), "git blob sha1"


def verified_copy(src: str | Path, entries: list[dict[str, Any]], dest: Path) -> Path:
    """Every file ``entries`` lists, read once from ``src`` and written to ``dest`` while its bytes are hashed;
    WeightsRefused naming the first that does not match (its size or its hash)."""
    for entry in entries:
        name = str(entry["name"])
        if name.startswith("/") or ".." in name.split("/"):
            raise WeightsRefused(f"base weights: the trusted manifest names a file outside the copy: {name!r}")
        digest, want, kind = _digest(entry)
        out, size = dest / name, 0
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(Path(src) / name, "rb") as f, open(out, "wb") as w:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    w.write(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise WeightsRefused(f"base weights: {name} is missing from {src}; refusing to load the model") from None
        if size != entry["size"] or digest.hexdigest() != want:
            raise WeightsRefused(
                f"base weights: {name} in {src} does not match the trusted manifest ({size} bytes, {kind} "
                f"{digest.hexdigest()}; expected {entry['size']} bytes, {want}); refusing to load it"
            )
    return dest


@functools.cache
def _local_copy(src: str, manifest: str) -> str:
    """One verified copy per process (the tokenizer and the model read the same one), removed at exit."""
    dest = tempfile.mkdtemp(prefix="tpupipe-weights-")
    atexit.register(shutil.rmtree, dest, True)
    entries = json.loads(manifest)
    try:
        verified_copy(src, entries, Path(dest))
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    print(f"base weights: {len(entries)} files of {src} checked against the trusted manifest", flush=True)
    return dest


def checked_dir() -> str:
    """The directory a job loads the run's base weights from: a verified copy of ``TPUPIPE_WEIGHTS_DIR`` on this
    machine; empty when the run has no cached copy. A directory without its manifest is refused."""
    src = os.environ.get(WEIGHTS_DIR_ENV, "")
    if not src:
        return ""
    manifest = os.environ.get(MANIFEST_ENV, "")
    if not manifest:
        raise WeightsRefused(f"base weights: {WEIGHTS_DIR_ENV}={src} comes without {MANIFEST_ENV}; refusing to load")
    return _local_copy(src, manifest)
