"""Base weights kept once per model revision: the hub checkpoint of ``train.model_id`` copied into the cache prefix
(``components.workload.cache.CACHE_PREFIX``: under the output root locally, the bucket's ``cache/`` on gke, mounted
at ``/cache`` in the worker pods) and read from there by every worker of every later run.

Where: ``weights/<repo id, '/' as '--'>/<commit>/files/`` under the cache prefix holds the files. The key is the
commit the hub resolves the revision to (a branch or tag moves; a commit does not), so a new revision is a new copy
and an old one is never served for it.

Who writes what: only the train stage, with the pipeline's identity, writes the copy (the pods mount the cache
read-only, and on gke their identity may only read it: ``components.workload.cache_trust``). What vouches for a
copy is its trusted manifest, ``weights/<repo>/<commit>.json`` in the trusted manifests' place (``cache_trust``'s
``manifests``: the bucket's ``state/_cache/``, which no pod's identity reaches), with each file's size and the hash
the hub itself reports for it, and ``weights/<repo>/refs/<revision>`` there, the commit the revision last resolved
to. Nothing in the cache prefix itself is trusted, neither a ``manifest.json`` nor a ``refs/`` a pod could have
planted there.

When: at the start of the train stage, on the components' side, before the train job is submitted: one download
per revision for the whole slice (the TPU hosts never reach the hub and need no token), and the evaluate stage
reads the same copy. The workers read it in parallel through the mount, each checking the bytes it loads against
the trusted manifest as it reads them (``trainers.weights_check``): the stage's check cannot vouch for a read that
comes later through the mount.

Whole or nothing: each file is downloaded to a temporary file, checked against the hash the hub reports (an LFS
file's ``lfs.sha256``; any other file's git blob sha1, its ``blobId``: ``HfApi.model_info(files_metadata=True)``'s
``RepoSibling``, https://huggingface.co/docs/huggingface_hub/package_reference/hf_api), and only then written to its
key (a whole object, or a rename on this machine); the trusted manifest is written last and nothing it does not
list is used. Every run checks the copy before use: the manifest's line of each file must be the hub's hash for the
commit (asked again whenever the hub answers), and the copy must still match it (locally each file's hash again; in
Cloud Storage the object's MD5, which the service computes, against the one recorded when it was written, without
reading it). A file whose bytes or manifest line changed, or both, is named in one warning line and downloaded
again (with the hub out of reach, the run stops naming it): never the file used. A download that does not hash to
the hub's listing stops the run naming the file. Only when no trusted manifest of the revision exists and the hub
either does not answer or refuses the files (a gated model: the hub lists its files to anyone but gives them only to a
token whose account was granted access) (``NoTrustedCopy``) does the stage let the workers download the model
themselves, unchecked, with one warning line (``components.stages.base_weights``).

No hub client is needed on the components' side: two plain HTTP calls of the hub's API, as ``huggingface_hub``
makes them (its ``hf_api.py``, ``HfApi.model_info(files_metadata=True)``: ``GET {endpoint}/api/models/{repo}/
revision/{revision}?blobs=true``; its ``file_download.py``, ``hf_hub_url``: ``{endpoint}/{repo}/resolve/{revision}/
{file}``). ``HF_ENDPOINT`` names another hub, as it does for ``huggingface_hub`` (its ``constants.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from components.spec import SCRATCH_PREFIX, InfraError
from components.spec.checks import DEFAULT_REVISION
from components.workload.cache_trust import Place

WEIGHTS_PREFIX = "weights"  # under the cache prefix
DEFAULT_ENDPOINT = "https://huggingface.co"  # huggingface_hub's constants.py: ENDPOINT, unless HF_ENDPOINT is set
WEIGHTS_DIR_ENV = "TPUPIPE_WEIGHTS_DIR"  # the copy's directory as the jobs see it (trainers.model.weights_source)
WEIGHTS_MANIFEST_ENV = "TPUPIPE_WEIGHTS_MANIFEST"  # the trusted manifest's files, which the jobs check at load
CHUNK = 1 << 20


class HubUnavailable(Exception):
    """The hub did not answer the revision's metadata (unreachable, a refused token, a server error)."""


class HubRefused(InfraError):
    """The hub listed the revision's files but refused one of them to this side: 401 (no token) or 403 (a token whose
    account was not granted access), X-Error-Code ``GatedRepo``. The hub gives a gated repository's listing to anyone
    and only its files to an account granted access (https://huggingface.co/docs/hub/models-gated#download-files;
    huggingface_hub's ``utils/_http.py``, ``hf_raise_for_status``: ``GatedRepoError``)."""


class NotOnHub(InfraError):
    """The hub answered 404 for a file of the commit it listed: the commit is gone (a branch whose history was
    squashed since it was listed) or the file is."""


class NoTrustedCopy(InfraError):
    """Nothing can be checked here: the hub did not answer, or refused the files (``HubRefused``), and the trusted side
    holds no manifest of the revision. The one case where the run goes on with the workers reading the hub themselves
    (``base_weights.prepare``)."""


# Where the pipeline's side takes its Hugging Face token from (``components.stages.base_weights.hub_token``).
TOKEN_FIX = (
    "accept the repository's terms on the hub and give the pipeline's side a token of that account "
    "(gke.hf_token_secret on gke; $HF_TOKEN or $HF_TOKEN_PATH where the pipeline runs)"
)


def refusal(status: int, repo_url: str, token: str | None) -> str:
    """Why the hub refused a repository with ``status`` (401 or 403), and the fix."""
    if token is None:
        why = "no Hugging Face token on the pipeline's side"
    elif status == 401:
        why = "the pipeline side's Hugging Face token is not valid"
    else:
        why = "the pipeline side's Hugging Face token is of an account not granted access"
    return f"the hub answered {status} ({why}; a gated or private repository: {repo_url}); {TOKEN_FIX}"


def is_hub_name(model_id: str) -> bool:
    """``org/name``: a model of the hub, not a scratch config nor a path on the machine."""
    if model_id.startswith((SCRATCH_PREFIX, "/", ".", "~")) or "://" in model_id or Path(model_id).is_dir():
        return False  # as transformers' from_pretrained, an existing directory is read as one
    return model_id.count("/") == 1 and all(model_id.split("/"))


def repo_key(repo_id: str) -> str:
    return f"{WEIGHTS_PREFIX}/{repo_id.replace('/', '--')}"


def key(repo_id: str, commit: str) -> str:
    """The copy of ``repo_id`` at ``commit`` under the cache prefix (the files are under ``files/``)."""
    return f"{repo_key(repo_id)}/{commit}"


def manifest_key(repo_id: str, commit: str) -> str:
    """The trusted manifest of the copy, under the trusted manifests' place (``cache_trust``'s ``manifests``)."""
    return f"{key(repo_id, commit)}.json"


def trusted_ref_key(repo_id: str, revision: str) -> str:
    """The commit ``revision`` last resolved to, kept beside the trusted manifests (never where a pod writes)."""
    return f"{repo_key(repo_id)}/refs/{urllib.parse.quote(revision, safe='')}"


def files_dir(root: str, repo_id: str, commit: str) -> str:
    """The copy's files as a job sees them, ``root`` being the cache prefix as the cluster mounts it."""
    return f"{root.rstrip('/')}/{key(repo_id, commit)}/files"


# ============================================================================ the hub


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or DEFAULT_ENDPOINT


class _SameHostAuth(urllib.request.HTTPRedirectHandler):
    """Redirects followed, the token sent on only to the host it was meant for: the hub answers a download of a
    large file with a redirect to its storage's signed URL (the Hub API docs, https://huggingface.co/docs/hub/api;
    huggingface_hub's ``file_download.py`` follows only relative redirects with its headers)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


def _open(url: str, token: str | None, timeout: float = 60.0) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    opener = urllib.request.build_opener(_SameHostAuth())
    return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)


# A repository's kind as the hub's API and download URLs spell it (huggingface_hub's ``hf_api.py``: ``model_info`` is
# ``/api/models/{repo}``, ``dataset_info`` ``/api/datasets/{repo}``; ``file_download.py``, ``hf_hub_url``: a dataset's
# files are under ``{endpoint}/datasets/{repo}/resolve/...``), with the spec's field that names it.
REPO_TYPES = {"model": ("api/models", "", "train.model_id"), "dataset": ("api/datasets", "datasets/", "train.dataset")}


def resolve(
    hub: str,
    repo_id: str,
    revision: str,
    token: str | None,
    repo_type: str = "model",
    keep: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """The commit ``revision`` resolves to and each file's size and hash, of the files ``keep`` takes (a model's:
    ``loaded_file``). The answer's ``sha`` is the commit; each of its ``siblings`` has ``rfilename``, ``size``,
    ``blobId`` (the git blob sha1) and, for an LFS file, ``lfs`` with ``sha256`` (the file's own hash; ``blobId`` is
    then the pointer's): huggingface_hub's ``hf_api.py``, ``ModelInfo``/``DatasetInfo`` and ``RepoSibling``.
    HubUnavailable when the hub does not answer; a 404 is a bad name."""
    api, _, field = REPO_TYPES[repo_type]
    keep = keep or loaded_file
    quoted = urllib.parse.quote(revision, safe="")
    url = f"{hub}/{api}/{repo_id}/revision/{quoted}?blobs=true"
    try:
        with _open(url, token) as response:
            info = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise InfraError(f"{field}: {repo_id} at {revision!r} is not on the hub ({hub})") from None
        why = f": {refusal(exc.code, repo_url(hub, repo_id, repo_type), token)}" if exc.code in (401, 403) else ""
        raise HubUnavailable(f"{hub} answered {exc.code} for {repo_id} at {revision!r}{why}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise HubUnavailable(f"{hub} is unreachable: {exc}") from None
    files = []
    for sib in info.get("siblings") or []:
        name = str(sib["rfilename"])
        if name.startswith("/") or ".." in name.split("/"):  # a path in the repository, never outside the copy
            raise InfraError(f"{field}: {repo_id} lists a file outside the repository: {name!r}")
        if not keep(name):
            continue
        lfs = sib.get("lfs") or {}
        entry: dict[str, Any] = {"name": name, "size": lfs.get("size", sib.get("size"))}
        entry.update({"sha256": lfs.get("sha256")} if lfs else {"git_sha1": sib.get("blobId")})
        if not isinstance(entry["size"], int) or not all(entry.get(k) for k in ("sha256", "git_sha1") if k in entry):
            raise InfraError(
                f"{field}: the hub's listing of {repo_id} at {revision!r} gives {name} without its size or "
                "hash: nothing to check it against; refusing to copy it"
            )
        files.append(entry)
    return {"commit": info["sha"], "files": files}


# What ``from_pretrained`` of a directory reads for a causal LM and its tokenizer (transformers: the config and
# generation config, the safetensors weights and their index, the tokenizer's files and chat template), at the
# repository's top level only: the rest of a repository (other formats' weights such as ``*.bin``, ``*.gguf`` or
# ``original/*.pth``, code, which is never run without ``trust_remote_code``) is neither downloaded nor copied. As
# huggingface_hub's ``snapshot_download(allow_patterns=...)``, names matched with ``fnmatch``.
LOADED_FILES = ("*.json", "*.safetensors", "tokenizer.model", "*.jinja", "vocab.txt", "merges.txt")


def loaded_file(name: str) -> bool:
    """Whether a repository file is one a load of the model or its tokenizer reads (``LOADED_FILES``)."""
    import fnmatch

    return "/" not in name and any(fnmatch.fnmatchcase(name, pattern) for pattern in LOADED_FILES)


def git_blob_sha1(path: Path) -> str:
    """Git's object id of the file: sha1 of ``blob <size>\\0`` then the bytes (the git book, "Git Objects",
    https://git-scm.com/book/en/v2/Git-Internals-Git-Objects)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    return _feed(digest, path)


def _feed(digest: Any, path: Path) -> str:
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return str(digest.hexdigest())


def matches(path: Path, entry: dict[str, Any]) -> bool:
    """Whether the file at ``path`` is the manifest's ``entry`` (its size, then its hub hash)."""
    if not path.is_file() or (entry.get("size") is not None and path.stat().st_size != entry["size"]):
        return False
    if "sha256" in entry:
        return _feed(hashlib.sha256(), path) == str(entry["sha256"])
    return git_blob_sha1(path) == str(entry["git_sha1"])


def download(
    hub: str,
    repo_id: str,
    commit: str,
    entry: dict[str, Any],
    token: str | None,
    into: Path,
    repo_type: str = "model",
) -> Path:
    """One file of the commit, streamed to a file under ``into`` and checked against the hub's hash. ``HubRefused``
    (its message names no field: the caller's) when the hub refuses it to this side."""
    _, prefix, field = REPO_TYPES[repo_type]
    url = f"{hub}/{prefix}{repo_id}/resolve/{commit}/{urllib.parse.quote(entry['name'])}"
    path = into / str(entry["name"])
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with _open(url, token, timeout=600.0) as response, open(path, "wb") as f:
            shutil.copyfileobj(response, f, CHUNK)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):  # a gated repository: listed to anyone, its files only to an account with access
            why = refusal(exc.code, repo_url(hub, repo_id, repo_type), token)
            raise HubRefused(f"{entry['name']} of {repo_id}@{commit}: {why}") from None
        if exc.code == 404:
            raise NotOnHub(f"{field}: {entry['name']} of {repo_id}@{commit} is no longer on the hub ({hub})") from None
        raise InfraError(f"{field}: downloading {entry['name']} of {repo_id}@{commit} failed: {exc}") from None
    except (urllib.error.URLError, OSError) as exc:  # the listing answered: a failed download stops the run
        raise InfraError(f"{field}: downloading {entry['name']} of {repo_id}@{commit} failed: {exc}") from None
    if not matches(path, entry):
        raise InfraError(
            f"{field}: {entry['name']} of {repo_id}@{commit} from {hub} does not match the hub's hash; "
            "refusing to use it"
        )
    return path


def repo_url(hub: str, repo_id: str, repo_type: str = "model") -> str:
    """The repository's page on the hub, where its terms are accepted (``hf_hub_url``'s prefix, without a file)."""
    return f"{hub}/{REPO_TYPES[repo_type][1]}{repo_id}"


def manifest_env(entries: list[dict[str, Any]]) -> str:
    """The trusted manifest as a job's environment carries it: each file's name, size and hub hash, no more."""
    return json.dumps([_record(e) for e in entries], separators=(",", ":"), sort_keys=True)


def md5_b64(path: Path) -> str:
    """The base64 MD5 Cloud Storage keeps of an object (``md5Hash``: https://cloud.google.com/storage/docs/hashes-etags)."""
    return base64.b64encode(bytes.fromhex(_feed(hashlib.md5(), path))).decode()


# ============================================================================ the cache


class Cache(Protocol):
    where: str

    def put(self, key: str, path: Path) -> None:
        """The file at ``path`` as ``key``, whole or not at all."""

    def intact(self, key: str, entry: dict[str, Any]) -> bool:
        """Whether ``key`` is still the manifest's ``entry``."""


class LocalCache:
    def __init__(self, root: Path):
        self.root, self.where = root, str(root)

    def put(self, key: str, path: Path) -> None:
        with tempfile.NamedTemporaryFile(dir=self._parent(key), delete=False) as f, open(path, "rb") as src:
            shutil.copyfileobj(src, f, CHUNK)
        os.replace(f.name, self.root / key)

    def intact(self, key: str, entry: dict[str, Any]) -> bool:
        return matches(self.root / key, entry)

    def _parent(self, key: str) -> Path:
        parent = (self.root / key).parent
        parent.mkdir(parents=True, exist_ok=True)
        return parent


class GcsCache:
    """The bucket's cache prefix through a Cloud Storage client (the stage's: ``components.platforms.store``)."""

    def __init__(self, bucket: str, prefix: str, client: Any):
        self.bucket_name, self.prefix, self._client = bucket, prefix.strip("/"), client
        self.where = f"gs://{bucket}/{self.prefix}"

    def _blob(self, key: str) -> Any:
        return self._client.bucket(self.bucket_name).blob(f"{self.prefix}/{key}")

    def put(self, key: str, path: Path) -> None:
        self._blob(key).upload_from_filename(str(path))

    def intact(self, key: str, entry: dict[str, Any]) -> bool:
        from google.api_core import exceptions as gexc

        blob = self._blob(key)
        try:
            blob.reload()
        except gexc.NotFound:
            return False
        return bool(blob.size == entry.get("size") and blob.md5_hash == entry.get("md5"))


def _trusted_manifest(trusted: Place, repo_id: str, commit: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The trusted manifest of ``repo_id`` at ``commit`` (file name -> its record), empty when there is none or it
    cannot be read (then every file is copied again, with a warning)."""
    name = manifest_key(repo_id, commit)
    raw = trusted.read(name)
    if raw is None:
        return {}
    try:
        files = json.loads(raw)["files"]
        if all({"name", "size"} <= set(e) and ({"sha256", "git_sha1"} & set(e)) for e in files):
            return {str(e["name"]): e for e in files}
    except (ValueError, KeyError, TypeError):
        pass
    log(f"WARNING: weights: the trusted manifest {trusted.where}/{name} is damaged; copying the files again")
    return {}


def lookup(trusted: Place, repo_id: str, revision: str) -> dict[str, Any] | None:
    """The commit ``revision`` last resolved to and its trusted manifest's files, or None (no copy yet)."""
    commit = trusted.read(trusted_ref_key(repo_id, revision))
    if not commit:
        return None
    files = _trusted_manifest(trusted, repo_id, commit.decode().strip(), lambda _: None)
    return {"commit": commit.decode().strip(), "files": list(files.values())} if files else None


def _hub_hash(entry: dict[str, Any]) -> tuple[Any, ...]:
    """What the hub says of a file: its size and its hash (the LFS sha256, else the git blob sha1)."""
    return entry.get("size"), entry.get("sha256"), entry.get("git_sha1")


def ensure(
    cache: Cache,
    trusted: Place,
    repo_id: str,
    revision: str,
    token: str | None,
    log: Callable[[str], None],
    hub: str = "",
) -> dict[str, Any]:
    """The copy of ``repo_id`` at ``revision`` in ``cache``, made or mended as needed, and its trusted manifest in
    ``trusted``: ``{"commit", "hit", "recopied", "files", "entries"}`` (``entries``: the manifest's records, what a
    worker checks the bytes it loads against). A cached file is used only when the trusted manifest lists it with
    the hub's own hash for the commit and the copy still matches that record; anything else (its bytes changed, its
    manifest line changed, both) is named in one warning line and downloaded again. Without the hub (unreachable, or
    refusing the listing) the trusted manifest of the commit the revision last resolved to serves, as
    huggingface_hub's offline mode serves its cache's ``refs/``. A gated model's files refused to this side (no
    token, or one without access: ``HubRefused``) where nothing of the commit is cached is ``NoTrustedCopy``."""
    hub = hub or endpoint()
    try:
        info = resolve(hub, repo_id, revision, token)
    except HubUnavailable as exc:
        found = lookup(trusted, repo_id, revision)
        if found is None:
            raise NoTrustedCopy(
                f"train.model_id: {repo_id} at {revision!r} is neither cached nor on the hub: {exc}"
            ) from None
        log(f"weights: the hub did not answer ({exc}); using the cached copy of {repo_id}@{found['commit']}")
        info = {**found, "offline": True}
    commit: str = info["commit"]
    base = key(repo_id, commit)
    recorded = _trusted_manifest(trusted, repo_id, commit, log)
    forged = [
        e["name"] for e in info["files"] if e["name"] in recorded and _hub_hash(recorded[e["name"]]) != _hub_hash(e)
    ]
    todo = [
        e
        for e in info["files"]
        if e["name"] not in recorded
        or e["name"] in forged
        or not cache.intact(f"{base}/files/{e['name']}", recorded[e["name"]])
    ]
    fetch = {e["name"] for e in todo}
    changed = sorted({e["name"] for e in todo if e["name"] in recorded} - set(forged))
    if changed or forged:
        what = (
            [f"{len(changed)} whose bytes do not match the trusted manifest ({', '.join(changed)})"] if changed else []
        )
        if forged:
            what.append(f"{len(forged)} whose manifest line is not the hub's hash ({', '.join(forged)})")
        log(
            f"WARNING: weights: cached {repo_id}@{commit} not used: {'; '.join(what)} (trusted manifest "
            f"{trusted.where}/{manifest_key(repo_id, commit)}); copying them again from the hub"
        )
    if todo and info.get("offline"):
        raise InfraError(
            f"train.model_id: the cached copy of {repo_id}@{commit} is damaged ({', '.join(sorted(fetch))} not as "
            f"the trusted manifest says) and the hub is unreachable to copy them again; refusing to train on them"
        )
    done = {n: e for n, e in recorded.items() if n not in fetch and n in {f["name"] for f in info["files"]}}
    with tempfile.TemporaryDirectory(prefix="tpupipe-weights-") as tmp:
        for entry in todo:
            try:
                path = download(hub, repo_id, commit, entry, token, Path(tmp))
            except HubRefused as exc:  # a gated model and no token with access here
                if recorded:  # a copy of this commit was made, and is damaged: as with the hub out of reach
                    raise InfraError(
                        f"train.model_id: the cached copy of {repo_id}@{commit} is damaged ({', '.join(sorted(fetch))} "
                        f"not as the trusted manifest says) and the hub refuses to copy them again: {exc}"
                    ) from None
                raise NoTrustedCopy(
                    f"train.model_id: no trusted copy of {repo_id}@{commit} is cached, and {exc}"
                ) from None
            cache.put(f"{base}/files/{entry['name']}", path)
            done[entry["name"]] = {**_record(entry), "md5": md5_b64(path)}
            path.unlink()
    entries = [done[n] for n in sorted(done)]
    if todo or set(recorded) != set(done):  # the bytes first, then the manifest that vouches for them
        doc = {"repo": repo_id, "commit": commit, "files": entries}
        trusted.write(manifest_key(repo_id, commit), json.dumps(doc, indent=1, sort_keys=True).encode())
    trusted.write(trusted_ref_key(repo_id, revision), commit.encode())
    hit = not todo
    log(f"weights: {repo_id}@{commit} {'read from' if hit else 'copied to'} {cache.where}/{base}")
    recopied = sorted(e["name"] for e in todo if e["name"] in recorded)
    return {"commit": commit, "hit": hit, "recopied": recopied, "files": len(done), "entries": entries}


def _record(entry: dict[str, Any]) -> dict[str, Any]:
    """A file's line of the trusted manifest: its name, size and hub hash, as the hub listed them."""
    return {k: entry[k] for k in ("name", "size", "sha256", "git_sha1") if k in entry}


# ============================================================================ the plan


def plan_entry(
    model_id: str,
    workload: str,
    uri_root: str,
    path_root: str,
    revision: str = DEFAULT_REVISION,
    manifest_root: str = "",
) -> dict[str, Any] | None:
    """Where the plan's run keeps its base weights of ``revision`` (``train.model_revision``): the cache prefix's
    ``uri_root`` (``gs://BUCKET/cache``) and as the pods see it (``path_root``). Whether the run finds a copy there
    is not known to a plan, which reads nothing and needs no credentials: the train stage resolves the revision to
    its commit and looks then. ``manifest_root``: the trusted manifests' place (``gs://BUCKET/state/_cache``), where
    the copy's manifest of the hub's hashes is kept. None for a run that reads no hub model (a scratch config, a
    local directory, MaxText)."""
    if workload == "maxtext" or not is_hub_name(model_id):
        return None
    where = repo_key(model_id)
    return {
        "model_id": model_id,
        "revision": revision,
        "uri": f"{uri_root.rstrip('/')}/{where}/",
        "path": f"{path_root.rstrip('/')}/{where}/COMMIT/files",
        "manifest": f"{manifest_root.rstrip('/')}/{where}/COMMIT.json",
        "cache_hit": "unknown until the train stage resolves the revision (tpupipe preflight looks in the bucket)",
        "unchecked_if": "the train stage finds no trusted manifest of the revision and cannot download it (the hub out "
        "of reach, or a gated model's files refused to its token): then the workers download the model themselves, "
        "unchecked (one WARNING line); any file that does not match stops the run",
    }


def plan_lines(entry: dict[str, Any] | None) -> list[str]:
    if not entry:
        return []
    return [
        f"  weights     {entry['model_id']}@{entry['revision']} read from {entry['uri']} (copied from the hub once per "
        f"commit by the train stage; pods: {entry['path']}); cache hit: {entry['cache_hit']}",
        f"              checked against the hub's hashes: by the train stage, and by each worker as it loads "
        f"(trusted manifest {entry['manifest']})",
        f"              unchecked only if {entry['unchecked_if']}",
    ]


def lookup_lines(
    model_id: str, workload: str, where: str, trusted: Place, revision: str = DEFAULT_REVISION
) -> list[str]:
    """What a preflight says of the run's base weights in the cache at ``where``: the copy ``revision`` last resolved
    to by the trusted manifests in ``trusted``, or none yet. The hub is not asked: a newer commit there is copied
    when the run starts."""
    if workload == "maxtext" or not is_hub_name(model_id):
        return []
    found = lookup(trusted, model_id, revision)
    if found is None:
        return [f"base weights {model_id}@{revision}: not in {where} yet; the train stage copies them once"]
    return [
        f"base weights {model_id}@{revision}: cached in {where} at commit {found['commit']} (what {revision} "
        "last resolved to; a newer commit on the hub is copied when the run starts)"
    ]
