"""Base weights checked at load, by the worker: the bytes it loads are the bytes the trusted side verified.

The train stage (the pipeline's identity) copies a hub model into the shared cache and records each file's hub hash
in a trusted manifest (``components.workload.weights``); the run's jobs get the copy's directory
(``TPUPIPE_WEIGHTS_DIR``) and that manifest's files (``TPUPIPE_WEIGHTS_MANIFEST``) in their definition, which no pod
writes. The copy itself is read through a mount (GCS FUSE on gke) whose objects can change between the stage's check
and a worker's read, and whatever a loader reads twice could differ between the reads. So a worker reads each listed
file once, hashing the bytes as they stream (an LFS file's sha256, any other file's git blob sha1: the hashes the
hub reports, https://huggingface.co/docs/huggingface_hub/package_reference/hf_api, ``RepoSibling.blob_id`` and
``lfs.sha256``) into a directory on the host, and loads from there only when every file matched: a mismatch refuses
the load, naming the file. Files the manifest does not list are not copied, so never loaded. One copy per host and
manifest: the first worker of the host makes it, the others wait and reuse it, and the last to finish loading
removes it (``_acquire``, ``release``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
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


def _host_dir(manifest: str) -> Path:
    """The host's copy for this manifest: one directory per manifest digest under the machine's temporary directory,
    shared by the workers of one host (one pod on gke, the machine locally)."""
    digest = hashlib.sha256(manifest.encode()).hexdigest()[:32]
    return Path(tempfile.gettempdir()) / f"tpupipe-weights-{digest}"


# This process's holds on its host's copies, by manifest: (the files' directory, the open ``use`` file it holds a
# shared lock on).
_held: dict[str, tuple[str, int]] = {}


def _acquire(src: str, manifest: str) -> tuple[str, int]:
    """The host's verified copy of ``src``, made by the first worker of the host and reused by the others.

    Two ``flock`` locks (released by the kernel when a process dies, even by SIGKILL, which is how Ray Train v2 ends
    its workers): ``lock``, held exclusively to make, take or remove the copy, so the others wait for the first; and
    ``use``, held shared by every live process that loads from the copy, and only once the copy is whole and
    verified. So when nobody holds ``use``, what is in the directory is not vouched for by any live process (left
    by a job that crashed, or half made): it is removed and copied and verified again, never trusted."""
    import fcntl

    top = _host_dir(manifest)
    top.mkdir(mode=0o700, exist_ok=True)
    files = top / "files"
    use = os.open(top / "use", os.O_RDWR | os.O_CREAT, 0o600)
    lock = os.open(top / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live worker of this host holds the copy it verified
            fcntl.flock(use, fcntl.LOCK_SH)
            print(f"base weights: reusing this host's checked copy of {src}", flush=True)
            return str(files), use
        shutil.rmtree(files, ignore_errors=True)  # a leftover nobody vouches for
        entries = json.loads(manifest)
        try:
            verified_copy(src, entries, files)
        except BaseException:
            shutil.rmtree(files, ignore_errors=True)
            os.close(use)
            raise
        fcntl.flock(use, fcntl.LOCK_SH)  # under ``lock``: no other process sees the change
        print(f"base weights: {len(entries)} files of {src} checked against the trusted manifest", flush=True)
        return str(files), use
    finally:
        os.close(lock)  # also releases its lock


def release() -> None:
    """This process is done loading: its hold on the host's copy is let go, and the copy removed when no other
    worker of the host still holds it. Idempotent; a process that took no copy does nothing."""
    while _held:
        _let_go(*_held.popitem()[1])


def _let_go(files: str, use: int) -> None:
    import fcntl

    lock = os.open(Path(files).parent / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fcntl.flock(use, fcntl.LOCK_UN)
        try:
            fcntl.flock(use, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another worker of the host still loads from it: the last one removes it
        shutil.rmtree(files, ignore_errors=True)
    finally:
        os.close(use)
        os.close(lock)


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around a job's loads of the base weights (tokenizer and model): the host's copy is let go when they are done,
    or failed (a ``finally``, which a worker ended by SIGKILL does not run: the next job's first worker on the host
    then finds no live holder and removes the copy)."""
    try:
        yield
    finally:
        release()


def checked_dir() -> str:
    """The directory a job loads the run's base weights from: this host's verified copy of ``TPUPIPE_WEIGHTS_DIR``,
    held by this process until :func:`release`; empty when the run has no cached copy. A directory without its
    manifest is refused."""
    src = os.environ.get(WEIGHTS_DIR_ENV, "")
    if not src:
        return ""
    manifest = os.environ.get(MANIFEST_ENV, "")
    if not manifest:
        raise WeightsRefused(f"base weights: {WEIGHTS_DIR_ENV}={src} comes without {MANIFEST_ENV}; refusing to load")
    if manifest not in _held:  # the tokenizer and the model read the same copy
        _held[manifest] = _acquire(src, manifest)
    return _held[manifest][0]
