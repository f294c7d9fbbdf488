"""One trusted writer for the compile cache, and one trusted producer: the programs every later run loads are compiled
by a dedicated compile job (the trainer's own code from the pinned image, on synthetic inputs of the run's shapes,
before any of the run's data or code reaches its cluster), hashed and recorded by the pipeline's side before the
training job starts; what the training job compiles stays in its own run and is never promoted.

Why: a compiled program is code. JAX's persistent compilation cache "is considered trusted" and whoever can write to
it can make a JAX process that reads it run arbitrary code (https://docs.jax.dev/en/latest/persistent_compilation_
cache.html, the warning under the first section). JAX checks an entry against nothing its writer could not forge: it
reads a directory (``jax_compilation_cache_dir``, MaxText's ``jax_cache_dir``) and runs what it finds there, and its
entry names are deterministic (a hash of the program, the options and the runtime: ``jax/_src/cache_key.py``), so
whoever first writes an entry for a name chooses what every later run of that name loads. Hashing a training job's
output after it ran pins its bytes, not who made them: so no training job's output is ever promoted.

Who writes what (the places ``Platform.cache_places`` gives, :class:`Places`):

- ``shared``: the cache kept across runs (``cache/compile/<key>/`` under the output root locally, in the bucket on
  gke). Written only here, by the pipeline's side (the train stage, with the pipeline's identity, never a pod's);
  the pods mount it read-only (and on gke their identity can only read it: ``plan.target.cache_binding``).
- ``manifests``: one JSON document per cache key, ``<key>.json`` (under ``_cache/`` of the runs' state root: the
  bucket's ``state/``, where no pod's identity may read or write), mapping every entry's name to the sha256 of its
  bytes and the compile job that made it, and naming the compile configurations already compiled (``compiled``).
  Written only here, after the entries' bytes, through :meth:`Place.update` (a generation precondition on Cloud
  Storage, retried), so two runs recording at once both keep their entries.
- ``compiled``: the compile jobs' directories (``<run dir>/compiled/<nonce>/<key>/``, the bucket's
  ``runs/<id>/compiled/<nonce>/<key>/``): one per attempt, named by a random nonce this side makes at submit
  (:func:`new_nonce`). The compile job writes it and reports each entry's name and sha256 in its result record (read
  from its log); :func:`record` takes only those entries, only with those bytes, before the training job is
  submitted: anything else a pod put there is ignored with a warning.
- ``run``: the training job's directory (``<run dir>/cache/<key>/``, the bucket's ``runs/<id>/cache/<key>/``). Before
  the training job, :func:`stage_in` copies into it every shared entry whose bytes hash to the manifest's value; an
  entry that does not (its bytes changed, its manifest line changed, both), or that the manifest does not list, or
  whose name is not a plain relative path, is left out, named in one warning line, and compiled again: never a failed
  run, never the entry used. What the training job writes there stays there.

What stays trusted: the compile job runs on the run's cluster with the run's pods' identity, so it is trusted because
of when it runs: its processes are fresh (Ray Train starts new worker processes for each job), they run the pinned
image's code on inputs made from the spec alone (no dataset, tokenizer, base weights, checkpoint or user code), and
no job of this run has loaded anything a user chose on that cluster yet (``components.stages.compile_cache`` runs no
compile job once the run's training job was ever submitted). Anyone who can write the manifests (the pipeline's
identity) can make the cache serve anything: that is the trust root.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple, Protocol

MANIFESTS_PREFIX = "_cache"  # under the runs' state root: not a run id (run ids are DNS labels: no underscore)
RUN_CACHE_DIR = "cache"  # under the run's own directory: the training job's compile cache, never promoted
COMPILE_DIR = "compiled"  # under the run's own directory: the compile job's output, recorded before training
MANIFEST_FORMAT = 2  # entries made by compile jobs; a manifest without it (a training job's promotion) is not read
# What one cache key may hold, in the shared cache: a record past either is cut (a warning naming what was left
# out, never a failed run). MaxText's programs for a model and slice number in the tens (26 for local-maxtext's
# train job) and weigh up to a few hundred MiB each on TPU; the caps leave room for many compile configurations
# (batch sizes, lengths, meshes) of one image while bounding what a bucket can be made to hold.
MAX_ENTRIES = 2048
MAX_BYTES = 32 * 2**30
# The compile job's own bound (``components.stages.compile_cache``; the janitor's run limit and the plan count it): it
# compiles a step or two on synthetic inputs, so a hung one must not hold the training job back for a whole
# train.timeout_s. Half an hour covers XLA's compiles of the largest presets' steps on a slice (minutes each); a job
# past it is stopped and the training job compiles for itself.
COMPILE_TIMEOUT_S = 1800.0
UPDATE_TRIES = 8  # a manifest update's reads and conditional writes before it gives up (each a competing writer)


class Place(Protocol):
    """A directory of named files: on this machine or under a Cloud Storage prefix."""

    where: str

    def names(self, under: str) -> list[str]:
        """The names of the files under ``under/``, relative to it, sorted."""

    def read(self, name: str) -> bytes | None: ...

    def write(self, name: str, data: bytes) -> None:
        """``data`` as ``name``, whole or not at all."""

    def update(self, name: str, change: Callable[[bytes | None], bytes]) -> None:
        """``name`` replaced by ``change(its bytes now)``, with no other writer's update lost in between."""


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

    def update(self, name: str, change: Callable[[bytes | None], bytes]) -> None:
        """Under an exclusive lock of ``.<name>.lock`` beside it: every process on this machine takes the same."""
        import fcntl

        lock = self.root / PurePosixPath(name).parent / f".{PurePosixPath(name).name}.lock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        with open(lock, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            self.write(name, change(self.read(name)))


class GcsPlace:
    """A prefix of a bucket through a Cloud Storage client (the pipeline's: ``components.platforms.store``)."""

    def __init__(self, bucket: str, prefix: str, client: Any, sleep: Callable[[float], None] = time.sleep):
        self.bucket, self.prefix, self._client, self._sleep = bucket, prefix.strip("/"), client, sleep
        self.where = f"gs://{bucket}/{self.prefix}"

    def names(self, under: str) -> list[str]:
        top = f"{self.prefix}/{under.strip('/')}/"
        found = (b.name[len(top) :] for b in self._client.list_blobs(self.bucket, prefix=top))
        # not the 0-byte "<dir>/" objects a FUSE mount makes for a directory (gcsfuse docs/semantics.md, "Files and
        # Directories": https://github.com/GoogleCloudPlatform/gcsfuse/blob/master/docs/semantics.md)
        return sorted(n for n in found if n and not n.endswith("/"))

    def read(self, name: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        try:
            return bytes(self._client.bucket(self.bucket).blob(f"{self.prefix}/{name}").download_as_bytes())
        except gexc.NotFound:
            return None

    def write(self, name: str, data: bytes) -> None:
        self._client.bucket(self.bucket).blob(f"{self.prefix}/{name}").upload_from_string(data)

    def update(self, name: str, change: Callable[[bytes | None], bytes]) -> None:
        """Read with the object's generation, write with ``ifGenerationMatch`` on it (0: only if there is still no
        object), and again from the read when another writer came between (412 Precondition Failed): Cloud Storage's
        read-modify-write ("Request preconditions", https://cloud.google.com/storage/docs/request-preconditions)."""
        from google.api_core import exceptions as gexc

        bucket = self._client.bucket(self.bucket)
        for attempt in range(UPDATE_TRIES):
            found = bucket.get_blob(f"{self.prefix}/{name}")
            try:
                data = bytes(found.download_as_bytes(if_generation_match=found.generation)) if found else None
                generation = found.generation if found else 0
                bucket.blob(f"{self.prefix}/{name}").upload_from_string(change(data), if_generation_match=generation)
                return
            except (gexc.PreconditionFailed, gexc.NotFound):  # another writer's generation came between
                self._sleep(min(0.1 * 2**attempt, 2.0))
        raise RuntimeError(f"{self.where}/{name}: still changed by another writer after {UPDATE_TRIES} tries")


class Places(NamedTuple):
    """The compile cache as the pipeline's side reaches it (see the module's docstring)."""

    shared: Place
    run: Place
    manifests: Place
    compiled: Place


def compile_timeout_s(spec: Any) -> float:
    """The compile job's deadline: ``COMPILE_TIMEOUT_S``, or the training job's own when that is shorter; 0 when the
    run has no compile job (the FSDP trainer keeps no shared cache)."""
    return min(COMPILE_TIMEOUT_S, spec.train.timeout_s) if spec.train.workload == "maxtext" else 0.0


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def kept(name: str) -> bool:
    """Whether a file of a cache directory is an entry: not a hidden one (a writer's temporary file, a lock)."""
    return not any(part.startswith(".") for part in PurePosixPath(name).parts)


def bad_name(name: str) -> str:
    """Why ``name`` cannot be an entry's (it would lead out of the key's directory), or empty: a relative path of
    plain parts, no ``..``, no absolute path, no backslash, no empty part."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        return f"{name!r} is not a plain relative path"
    return ""


def manifest_name(key: str) -> str:
    return f"{key}.json"


def parse_manifest(raw: bytes | None, where: str) -> tuple[dict[str, Any], str]:
    """A manifest's document (``entries``: entry name -> ``sha256``, ``size``, ``run``; ``compiled``: compile
    configuration -> the run whose compile job compiled it) and, when it cannot be used, why (then it is empty:
    every entry is compiled again)."""
    empty: dict[str, Any] = {"format": MANIFEST_FORMAT, "entries": {}, "compiled": {}}
    if raw is None:
        return empty, ""
    try:
        doc = json.loads(raw)
        if doc.get("format") != MANIFEST_FORMAT:
            raise ValueError("written before compile jobs made the cache's entries: its entries are a training job's")
        if not isinstance(doc["entries"], dict) or not all(isinstance(e, dict) for e in doc["entries"].values()):
            raise ValueError("its entries are not a mapping of records")
        return {**empty, **doc}, ""
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return empty, f"the manifest {where} cannot be read ({e})"


def read_manifest(manifests: Place, key: str) -> tuple[dict[str, Any], str]:
    return parse_manifest(manifests.read(manifest_name(key)), f"{manifests.where}/{manifest_name(key)}")


def stage_in(shared: Place, run: Place, manifests: Place, key: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Copy into ``run`` every entry of ``shared`` under ``key`` whose bytes hash to the manifest's value; say in one
    warning line what was left out. Returns the counts, the names refused and those staged (for :func:`record`), and
    the compile configurations the manifest says were compiled."""
    doc, unreadable = read_manifest(manifests, key)
    entries = doc["entries"]
    staged, refused, size = [], [], 0
    for name, entry in sorted(entries.items()):
        data = None if bad_name(name) else shared.read(f"{key}/{name}")
        # gone bytes are refused too: the compile job makes them again (else the configuration stays "compiled")
        if data is None or not kept(name) or sha256(data) != entry.get("sha256"):
            refused.append(name)
            continue
        run.write(f"{key}/{name}", data)
        staged.append(name)
        size += len(data)
    unlisted = [n for n in shared.names(key) if kept(n) and n not in entries]
    if refused or unlisted or unreadable:
        what = [unreadable] if unreadable else []
        if refused:
            what.append(f"{len(refused)} whose bytes or names do not match the manifest's ({_few(refused)})")
        if unlisted:
            what.append(f"{len(unlisted)} the manifest does not list ({_few(unlisted)})")
        log(
            f"WARNING: compile cache {shared.where}/{key}: not used: {'; '.join(what)} "
            f"(trusted manifest {manifests.where}/{manifest_name(key)}); compiled again"
        )
    return {
        "key": key,
        "staged": len(staged),
        "bytes": size,
        "refused": refused,
        "unlisted": len(unlisted),
        "names": staged,
        "compiled": sorted(doc["compiled"]),
    }


def new_nonce() -> str:
    """A compile job attempt's directory name under ``compiled/``: random (``secrets``), made here at submit, never
    reused and not derivable from the run id, so nothing the run's pods wrote before the job can sit in it."""
    import secrets

    return secrets.token_hex(16)


def record(
    places: Places,
    key: str,
    run_id: str,
    config: str,
    staged: list[str],
    reported: dict[str, str],
    under: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """After the compile job of compile configuration ``config``, before the training job: the entries the job
    reported (``reported``: name -> sha256, from its own record in its log) read from its attempt's directory
    ``under`` (``<nonce>/<key>`` in ``places.compiled``), each only when its bytes hash to what the job reported,
    copied into the shared cache and into the training job's directory, bytes first, then recorded in the manifest
    (a reader trusts nothing it does not list). Anything else in the directory is ignored with a warning. An entry
    the manifest lists is left as it is unless the stage-in did not stage it (``staged``: its bytes or its line
    changed, or they were gone): then the compile job's replaces it. At most ``MAX_ENTRIES`` entries and
    ``MAX_BYTES`` bytes per key: what would pass them is left out with a warning (the training job compiles it for
    itself). The configuration is marked compiled only when this job's entries were all recorded (or held already)
    and at least one was: else the next run compiles it again."""
    doc, _ = read_manifest(places.manifests, key)
    held = {n: e for n, e in doc["entries"].items() if n in staged}  # what stays, before this job's entries
    count, size = len(held), sum(int(e.get("size", 0)) for e in held.values())
    new: dict[str, dict[str, Any]] = {}
    skipped, over, unreported, mismatched = [], [], [], []
    present = places.compiled.names(under)
    for name in sorted(set(present) | set(reported)):
        if name not in reported:
            unreported.append(name)
            continue
        if bad_name(name) or not kept(name):
            skipped.append(name)
            continue
        if name in staged:
            continue
        data = places.compiled.read(f"{under}/{name}")
        if data is None or sha256(data) != reported[name]:
            mismatched.append(name)
            continue
        if count + 1 > MAX_ENTRIES or size + len(data) > MAX_BYTES:
            over.append(name)
            continue
        places.shared.write(f"{key}/{name}", data)
        places.run.write(f"{key}/{name}", data)
        new[name] = {"sha256": reported[name], "size": len(data), "run": run_id, "by": "compile job"}
        count, size = count + 1, size + len(data)
    complete = bool(reported) and not (skipped or over or mismatched)

    def change(raw: bytes | None) -> bytes:
        now, _ = parse_manifest(raw, "")
        now["entries"].update(new)
        if complete:
            now["compiled"][config] = {"run": run_id, "entries": len(new)}
        return json.dumps({**now, "key": key, "entries": dict(sorted(now["entries"].items()))}, indent=1).encode()

    if new or complete:
        places.manifests.update(manifest_name(key), change)  # after the bytes: no listed entry is missing its bytes
    where = f"{places.compiled.where}/{under}"
    for names, why in (
        (unreported, "the compile job did not report them"),
        (mismatched, "their bytes are gone or do not hash to what the compile job reported"),
        (skipped, "not a plain relative path"),
    ):
        if names:
            log(f"WARNING: compile cache {where}: {len(names)} not recorded ({_few(names)}): {why}")
    if over:
        log(
            f"WARNING: compile cache {places.shared.where}/{key}: {len(over)} of the compile job's entries not "
            f"recorded ({_few(over)}): the key holds at most {MAX_ENTRIES} entries and {MAX_BYTES / 2**30:g} GiB; the "
            "training job compiles them for itself"
        )
    if not complete:
        log(f"WARNING: compile cache: configuration {config} not marked compiled: the next run's compile job retries")
    log(f"compile cache: {len(new)} entries of run {run_id}'s compile job recorded in {places.shared.where}/{key}")
    return {
        "key": key,
        "recorded": len(new),
        "bytes": sum(e["size"] for e in new.values()),
        "over_cap": len(over),
        "ignored": len(unreported) + len(mismatched) + len(skipped),
        "compiled": complete,
    }


def _few(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")
