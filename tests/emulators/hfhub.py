"""The Hugging Face Hub's HTTP endpoints that a model download calls, on 127.0.0.1 (``HF_ENDPOINT`` names it, as
huggingface_hub's ``constants.py`` reads it): a repository's revision metadata and its files, with the headers the
clients read. Repositories are given as files in memory; nothing is downloaded from anywhere.

Each rule names the public source it follows: huggingface_hub 2.4 (``hf_api.py``, ``file_download.py``,
``utils/_http.py``) and the Hub API docs (https://huggingface.co/docs/hub/api).
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# Which files the hub keeps in LFS: a repository's .gitattributes names them; the hub's default one stores weights
# (*.safetensors, *.bin, ...) in LFS (https://huggingface.co/docs/hub/repositories-getting-started: "Git LFS").
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".model", ".parquet")


def git_blob_sha1(data: bytes) -> str:
    """Git's blob id (https://git-scm.com/book/en/v2/Git-Internals-Git-Objects)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The pointer file git keeps for an LFS file (https://github.com/git-lfs/git-lfs/blob/main/docs/spec.md)."""
    oid = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit sha -> files
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit sha
    # A gated repository (https://huggingface.co/docs/hub/models-gated): its listing is open to anyone, its files only
    # to a token whose account was granted access (see ``HubEmulator._files``).
    gated: bool = False
    pushes: int = 0

    def push(self, files: dict[str, bytes], ref: str = "main", squash: bool = False) -> str:
        """A commit of ``files`` on ``ref``; its sha is derived from the files (a stand-in for git's). ``squash``: the
        ref's history squashed into the new commit, so the commit it pointed to is gone, as the dataset viewer does to
        ``refs/convert/parquet`` after each conversion (``committer_hf_api.super_squash_history`` in
        https://github.com/huggingface/dataset-viewer/blob/f62009e0555b1274e7f6ddc7058dc796993f28b6/services/worker/src/worker/job_runners/config/parquet_and_info.py#L1203-L1212)."""
        before = self.refs.get(ref)
        digest = hashlib.sha1()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + git_blob_sha1(files[name]).encode())
        self.pushes += 1
        digest.update(ref.encode() + str(self.pushes).encode())  # never the same twice, as a git commit's parent
        sha = digest.hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        if squash and before is not None and before not in self.refs.values():
            del self.commits[before]
        return sha

    def resolve(self, revision: str) -> str | None:
        """A branch or tag's commit, or a commit sha itself (the hub accepts either as ``revision``)."""
        return self.refs.get(revision) or (revision if revision in self.commits else None)


def directory_files(path: str | Path) -> dict[str, bytes]:
    """Every file under ``path`` (a saved checkpoint), by its path relative to it."""
    root = Path(path)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class HubEmulator:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.datasets: dict[str, Repo] = {}
        self.token = "hf_test_token"
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, in order
        self.authorized: list[str] = []  # the paths of the requests that carried an Authorization header
        # An LFS file's download answered with a redirect to its storage on another host, as the hub does (the Hub
        # API docs, https://huggingface.co/docs/hub/api; file_download.py follows only relative redirects itself).
        self.lfs_redirect = False
        self._server: ThreadingHTTPServer | None = None

    @property
    def downloads(self) -> list[str]:
        return [path for method, path in self.requests if method == "GET" and "/resolve/" in path]

    def repo(self, repo_id: str) -> Repo:
        return self.repos.setdefault(repo_id, Repo())

    def dataset(self, repo_id: str) -> Repo:
        """A dataset repository: its own namespace, as on the hub (``datasets/`` in its URLs)."""
        return self.datasets.setdefault(repo_id, Repo())

    # ------------------------------------------------------------------ the endpoints

    def handle(self, method: str, raw_path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        self.requests.append((method, raw_path))
        if "authorization" in headers:
            self.authorized.append(raw_path)
        url = urllib.parse.urlsplit(raw_path)
        path = urllib.parse.unquote(url.path)
        parts = path.strip("/").split("/")
        if parts[0] == "storage" and len(parts) == 2:  # the other host of lfs_redirect, by the file's sha256
            return self._stored(parts[1])
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            return self._model_info(f"{parts[2]}/{parts[3]}", "/".join(parts[5:]), url.query)
        # hf_api.py, dataset_info: /api/datasets/{repo}/revision/{revision}, the revision quoted whole (so
        # refs/convert/parquet, the dataset viewer's Parquet branch, arrives as one segment and reads back with its /)
        if parts[:2] == ["api", "datasets"] and len(parts) >= 6 and parts[4] == "revision":
            return self._model_info(f"{parts[2]}/{parts[3]}", "/".join(parts[5:]), url.query, self.datasets)
        if parts[0] == "datasets" and len(parts) >= 6 and parts[3] == "resolve":  # file_download.py, hf_hub_url
            name = "/".join(parts[5:])
            return self._resolve(f"{parts[1]}/{parts[2]}", parts[4], name, method, headers, self.datasets)
        if parts[:2] == ["api", "models"] and len(parts) == 4:  # hf_api.py, model_info: no revision, the default branch
            return self._model_info(f"{parts[2]}/{parts[3]}", "main", url.query)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), method, headers)
        return _error(404, "EntryNotFound", f"no route {path}")

    def _access(
        self, repo_id: str, revision: str, repos: dict[str, Repo] | None = None
    ) -> tuple[Repo, str] | tuple[int, dict, bytes]:
        repo = (self.repos if repos is None else repos).get(repo_id)
        if repo is None:
            # utils/_http.py, hf_raise_for_status: X-Error-Code RepoNotFound (401 or 404) -> RepositoryNotFoundError
            return _error(404, "RepoNotFound", f"Repository {repo_id} not found")
        commit = repo.resolve(revision)
        if commit is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")  # -> RevisionNotFoundError
        return repo, commit

    def _model_info(self, repo_id: str, revision: str, query: str, repos=None):
        # A gated repository's listing (its commit and its files with their sizes and hashes) is given without a token:
        # only its files are refused (``_files``). The hub's own file page of a gated model says "You can list files
        # but not access them" (e.g. https://huggingface.co/tthelin/gatedmodeltest/tree/main), a tokenless
        # ``model_info`` of meta-llama/Llama-3.2-1B answers while its ``/resolve/`` answers 401
        # (https://github.com/unslothai/unsloth-zoo/pull/1050), and the same is reported in
        # https://github.com/dkackman/diffusers-workflow/issues/186.
        found = self._access(repo_id, revision, repos)
        if not isinstance(found[0], Repo):
            return found
        repo, commit = found
        blobs = urllib.parse.parse_qs(query).get("blobs") == ["true"]
        siblings = []
        for name, data in sorted(repo.commits[commit].items()):
            sib: dict = {"rfilename": name}
            if blobs:  # hf_api.py, RepoSibling: size, blobId and lfs only when files_metadata (blobs=true) asks
                lfs = name.endswith(LFS_SUFFIXES)
                sib["size"] = len(data)
                # the blob git stores: the pointer for an LFS file, whose own hash is lfs.sha256 (hf_api.py,
                # BlobLfsInfo: size, sha256, pointer_size)
                stored = lfs_pointer(data) if lfs else data
                sib["blobId"] = git_blob_sha1(stored)
                if lfs:
                    sib["lfs"] = {
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": len(stored),
                    }
            siblings.append(sib)
        body = {
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit,
            "private": False,
            "gated": "auto" if repo.gated else False,  # hf_api.py, ModelInfo.gated: "auto", "manual" or False
            "siblings": siblings,
        }
        return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()

    def _resolve(self, repo_id: str, revision: str, name: str, method: str, headers: dict[str, str], repos=None):
        found = self._access(repo_id, revision, repos)
        if not isinstance(found[0], Repo):
            return found
        repo, commit = found
        refused = self._files(repo_id, repo, headers)
        if refused is not None:
            return refused
        data = repo.commits[commit].get(name)
        if data is None:
            return _error(404, "EntryNotFound", f"{name} not in {repo_id}@{revision}")
        # file_download.py, get_hf_file_metadata: the commit from X-Repo-Commit; the etag from X-Linked-Etag (an LFS
        # file: its sha256) or else ETag (the git blob sha1); the size from X-Linked-Size or else Content-Length.
        out = {"X-Repo-Commit": commit, "Content-Length": str(len(data)), "Content-Type": "application/octet-stream"}
        if name.endswith(LFS_SUFFIXES):
            out["X-Linked-Etag"] = f'"{hashlib.sha256(data).hexdigest()}"'
            out["X-Linked-Size"] = str(len(data))
            out["ETag"] = f'"{git_blob_sha1(lfs_pointer(data))}"'
            if self.lfs_redirect:  # "localhost", not 127.0.0.1: another host to a client
                port = self.url.rsplit(":", 1)[1]
                location = f"http://localhost:{port}/storage/{hashlib.sha256(data).hexdigest()}"
                return 302, {**out, "Location": location, "Content-Length": "0"}, b""
        else:
            out["ETag"] = f'"{git_blob_sha1(data)}"'
        return 200, out, b"" if method == "HEAD" else data

    def _files(self, repo_id: str, repo: Repo, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes] | None:
        """A gated repository's files refused (None: given): 401 to a caller without a token, 403 to a token whose
        account was not granted access, both with X-Error-Code GatedRepo, which huggingface_hub raises as
        ``GatedRepoError`` whatever the status (utils/_http.py, hf_raise_for_status). The Hub docs, "Gated models":
        "To download files from a gated model you'll need to be authenticated"
        (https://huggingface.co/docs/hub/models-gated#download-files); a token whose account has no access is answered
        403 "Cannot access gated repo" (https://github.com/huggingface/transformers/issues/31367). Only ``self.token``
        has access here."""
        if not repo.gated:
            return None
        given = headers.get("authorization")
        if given is None:
            return _error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must be authenticated.")
        if given != f"Bearer {self.token}":
            return _error(
                403, "GatedRepo", f"Access to model {repo_id} is restricted and you are not in the authorized list."
            )
        return None

    def _stored(self, sha256: str) -> tuple[int, dict[str, str], bytes]:
        for repo in [*self.repos.values(), *self.datasets.values()]:
            for files in repo.commits.values():
                for data in files.values():
                    if hashlib.sha256(data).hexdigest() == sha256:
                        return 200, {"Content-Type": "application/octet-stream"}, data
        return 404, {}, b""

    # ------------------------------------------------------------------ the server

    def start(self) -> str:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                heads = {k.lower(): v for k, v in self.headers.items()}
                status, out, body = emulator.handle(self.command, self.path, heads)
                self.send_response(status)
                for k, v in out.items():
                    self.send_header(k, v)
                if "Content-Length" not in out:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_HEAD = _answer

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, str], bytes]:
    """An error as the hub sends it: the kind in ``X-Error-Code``, the text in ``X-Error-Message`` and the JSON body's
    ``error`` (utils/_http.py, hf_raise_for_status and _format)."""
    heads = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
    return status, heads, json.dumps({"error": message}).encode()
