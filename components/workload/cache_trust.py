"""One trusted writer for the compile cache: the run's pods never write the cache every later run reads, and a run
loads an entry only when its bytes hash to what the trusted manifest says.

Why: a compiled program is code. JAX's persistent compilation cache "is considered trusted" and whoever can write to
it can make a JAX process that reads it run arbitrary code (https://docs.jax.dev/en/latest/persistent_compilation_
cache.html, the warning under the first section); TorchTPU's cache of compiled executables is the same kind of thing.
Neither library checks an entry against anything its writer could not forge: JAX reads a directory
(``jax_compilation_cache_dir``, MaxText's ``jax_cache_dir``; TorchTPU's ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT``)
and runs what it finds there. So the verification happens before either library is pointed at a directory, and the
directory it is pointed at holds only entries that passed it.

Who writes what (the places ``Platform.cache_places`` gives):

- ``shared``: the cache kept across runs (``cache/compile/<key>/`` under the output root locally, in the bucket on
  gke). Written only here, by the pipeline's side (the train stage, with the pipeline's identity, never a pod's);
  the pods mount it read-only (and on gke their identity can only read it: ``plan.target.cache_binding``).
- ``manifests``: one JSON document per cache key, ``<key>.json`` (under ``_cache/`` of the runs' state root: the
  bucket's ``state/``, where no pod's identity may read or write), mapping every entry's name to the sha256 of its
  bytes. Written only here, after the entry's bytes.
- ``run``: the run's own copy (``<run dir>/cache/<key>/``, the bucket's ``runs/<id>/cache/<key>/`` on gke), the
  directory the trainers are given. Before the train job, :func:`stage_in` copies into it every shared entry whose
  bytes hash to the manifest's value; an entry that does not (its bytes changed, its manifest line changed, both), or
  that the manifest does not list, is left out, named in one warning line, and the trainer compiles it again: never a
  failed run, never the entry used. After the train job succeeds, :func:`promote` copies what the run added back into
  ``shared`` and records its hash; an entry the manifest already lists with bytes that still match is never replaced
  by a run's (the first writer's stands), so a pod that rewrites a staged entry in its own directory changes nothing
  any other run loads.

What stays trusted: the entries a run's job produces are promoted as they are (nothing can tell a compiled program
from a planted one without compiling it again), so a job that ran hostile code can still leave an entry for its
key; the manifest pins those bytes from then on, and promotion happens only after the train job succeeded. Anyone
who can write the manifests (the pipeline's identity) can make the cache serve anything: that is the trust root.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

MANIFESTS_PREFIX = "_cache"  # under the runs' state root: not a run id (run ids are DNS labels: no underscore)
RUN_CACHE_DIR = "cache"  # under the run's own directory: what its jobs produce for the caches


class Place(Protocol):
    """A directory of named files: on this machine or under a Cloud Storage prefix."""

    where: str

    def names(self, under: str) -> list[str]:
        """The names of the files under ``under/``, relative to it, sorted."""

    def read(self, name: str) -> bytes | None: ...

    def write(self, name: str, data: bytes) -> None:
        """``data`` as ``name``, whole or not at all."""


class LocalPlace:
    def __init__(self, root: Path):
        self.root, self.where = root, str(root)

    def names(self, under: str) -> list[str]:
        top = self.root / under
        return sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file()) if top.is_dir() else []

    def read(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.is_file() else None

    def write(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".", delete=False) as f:
            f.write(data)
        os.replace(f.name, path)


class GcsPlace:
    """A prefix of a bucket through a Cloud Storage client (the pipeline's: ``components.platforms.store``)."""

    def __init__(self, bucket: str, prefix: str, client: Any):
        self.bucket, self.prefix, self._client = bucket, prefix.strip("/"), client
        self.where = f"gs://{bucket}/{self.prefix}"

    def names(self, under: str) -> list[str]:
        top = f"{self.prefix}/{under.strip('/')}/"
        return sorted(b.name[len(top) :] for b in self._client.list_blobs(self.bucket, prefix=top))

    def read(self, name: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        try:
            return bytes(self._client.bucket(self.bucket).blob(f"{self.prefix}/{name}").download_as_bytes())
        except gexc.NotFound:
            return None

    def write(self, name: str, data: bytes) -> None:
        self._client.bucket(self.bucket).blob(f"{self.prefix}/{name}").upload_from_string(data)


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def kept(name: str) -> bool:
    """Whether a file of a run's cache directory is an entry: not a hidden one (a writer's temporary file, a lock)."""
    return not any(part.startswith(".") for part in Path(name).parts)


def manifest_name(key: str) -> str:
    return f"{key}.json"


def read_manifest(manifests: Place, key: str) -> tuple[dict[str, dict[str, Any]], str]:
    """The manifest of ``key`` (entry name -> its record: ``sha256``, ``size``, ``run``) and, when it cannot be read,
    why (then it is empty: every entry is compiled again)."""
    raw = manifests.read(manifest_name(key))
    if raw is None:
        return {}, ""
    try:
        entries = json.loads(raw)["entries"]
        if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
            raise ValueError("its entries are not a mapping of records")
        return entries, ""
    except (ValueError, KeyError, TypeError) as e:
        return {}, f"the manifest {manifests.where}/{manifest_name(key)} cannot be read ({e})"


def stage_in(shared: Place, run: Place, manifests: Place, key: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Copy into ``run`` every entry of ``shared`` under ``key`` whose bytes hash to the manifest's value; say in one
    warning line what was left out. Returns the counts and the names refused (for :func:`promote`)."""
    entries, unreadable = read_manifest(manifests, key)
    copied, refused, size = 0, [], 0
    for name, entry in sorted(entries.items()):
        data = shared.read(f"{key}/{name}")
        if data is None:
            continue  # gone: a miss like any other
        if not kept(name) or sha256(data) != entry.get("sha256"):
            refused.append(name)
            continue
        run.write(f"{key}/{name}", data)
        copied, size = copied + 1, size + len(data)
    unlisted = [n for n in shared.names(key) if kept(n) and n not in entries]
    if refused or unlisted or unreadable:
        what = [unreadable] if unreadable else []
        if refused:
            what.append(f"{len(refused)} whose bytes do not hash to the manifest's ({_few(refused)})")
        if unlisted:
            what.append(f"{len(unlisted)} the manifest does not list ({_few(unlisted)})")
        log(
            f"WARNING: compile cache {shared.where}/{key}: not used: {'; '.join(what)} "
            f"(trusted manifest {manifests.where}/{manifest_name(key)}); compiled again"
        )
    return {"key": key, "staged": copied, "bytes": size, "refused": refused, "unlisted": len(unlisted)}


def promote(
    run: Place,
    shared: Place,
    manifests: Place,
    key: str,
    run_id: str,
    refused: list[str],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Copy what the run's jobs added under ``key`` into ``shared``, bytes first, then their hashes into the
    manifest (a reader trusts nothing the manifest does not list). An entry the manifest lists is left as it is
    unless this run found it refused (its bytes or its line changed): then the run's own replaces it."""
    entries, _ = read_manifest(manifests, key)  # read again: another run may have promoted since the stage-in
    promoted = []
    for name in run.names(key):
        if not kept(name) or (name in entries and name not in refused):
            continue
        data = run.read(f"{key}/{name}")
        if data is None:
            continue
        shared.write(f"{key}/{name}", data)
        entries[name] = {"sha256": sha256(data), "size": len(data), "run": run_id}
        promoted.append(name)
    if promoted:
        doc = {"key": key, "entries": dict(sorted(entries.items()))}
        manifests.write(manifest_name(key), json.dumps(doc, indent=1).encode())
        log(f"compile cache: {len(promoted)} entries of run {run_id} promoted to {shared.where}/{key}")
    return {"key": key, "promoted": len(promoted), "entries": len(entries)}


def _few(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
