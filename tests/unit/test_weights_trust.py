"""Base weights have one trusted writer and are checked against the hub's own hashes, twice: by the train stage (the
pipeline's identity) against the hub's listing before a cached copy is used, and by the worker against the trusted
manifest as it reads the bytes it loads (``components.workload.weights``, ``trainers.weights_check``), on the local
platform against the hub emulator (``tests/emulators/hfhub.py``).

- a planted entry (its bytes changed, its trusted manifest line changed, both) is not used by the next run: one
  warning line naming the file, a fresh download, and the run's workers load the hub's bytes;
- a file changed after the trusted manifest was written is refused at load, naming the file;
- what is checked is the hub's own hashes: the manifest holds the ``lfs.sha256`` and ``blobId`` the hub's API
  lists, and a run-writable ``refs/`` or ``manifest.json`` in the cache is never read.
"""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import pytest

from components.platforms import RunContext
from components.platforms.store import LocalStore
from components.spec import InfraError
from components.stages import base_weights
from components.workload import cache_trust, resolve, weights
from tests.emulators.hfhub import HubEmulator, git_blob_sha1
from trainers import weights_check

REPO = "google/tiny-gemma"
FILES = {
    "config.json": b'{"model_type": "gemma4"}',
    "model.safetensors": bytes(range(256)) * 64,  # an LFS file: its sha256
    "tokenizer.json": b'{"version": "1.0"}',  # a git file: its blob sha1
}
PLANTED = bytes(reversed(FILES["model.safetensors"]))  # same size: only a hash tells


@pytest.fixture(autouse=True)
def _own_host_dir(tmp_path, monkeypatch):
    """A temporary directory of this test's own for the host's verified copies (trainers.weights_check keys them by
    manifest alone): a copy another process holds of the same files is not this test's worker's."""
    (tmp_path / "host").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "host"))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    yield
    weights_check.release()


@pytest.fixture
def hub(monkeypatch):
    emulator = HubEmulator()
    emulator.repo(REPO).push(FILES)
    monkeypatch.setenv("HF_ENDPOINT", emulator.start())
    yield emulator
    emulator.stop()


def prepared(root: Path, run_id: str) -> tuple[RunContext, dict, list[str]]:
    """The train stage's base weights of a local run: (the run, its record, its log lines)."""
    ctx = RunContext(
        spec=resolve("local-fsdp", {"model_id": REPO}), run_id=run_id, store=LocalStore(root / run_id), platform="local"
    )
    lines: list[str] = []
    record = base_weights.prepare(ctx, lines.append)
    assert record is not None
    return ctx, record, lines


def loaded(ctx: RunContext, monkeypatch) -> dict[str, bytes]:
    """What a worker of the run loads: the files of the directory ``trainers.model.weights_source`` gives it."""
    for name, value in base_weights.job_env(ctx).items():
        monkeypatch.setenv(name, value)
    weights_check.release()  # a fresh worker process
    top = Path(weights_check.checked_dir())
    return {p.relative_to(top).as_posix(): p.read_bytes() for p in top.rglob("*") if p.is_file()}


def manifest_path(root: Path, commit: str) -> Path:
    return root / cache_trust.MANIFESTS_PREFIX / weights.manifest_key(REPO, commit)


def plant(how: str, root: Path, commit: str) -> None:
    """What a pod that could write the cache would do; the trusted manifest is changed as if its place leaked."""
    files = Path(weights.files_dir(str(root / "cache"), REPO, commit))
    if how in ("bytes", "both"):
        (files / "model.safetensors").write_bytes(PLANTED)
    if how in ("manifest", "both"):
        doc = json.loads(manifest_path(root, commit).read_text())
        line = next(e for e in doc["files"] if e["name"] == "model.safetensors")
        line["sha256"] = hashlib.sha256(PLANTED).hexdigest()
        manifest_path(root, commit).write_text(json.dumps(doc))
    # what the cache used to trust, run-writable: a manifest and a ref that vouch for the planted bytes
    (files.parent / "manifest.json").write_text(json.dumps({"files": [{"name": "model.safetensors", "size": 1}]}))
    (files.parent.parent / "refs").mkdir(exist_ok=True)
    (files.parent.parent / "refs" / "main").write_text("0" * 40)


@pytest.mark.parametrize("how", ["bytes", "manifest", "both"])
def test_a_planted_weights_entry_is_not_loaded_by_the_next_run_which_warns_once_and_succeeds(
    tmp_path, hub, monkeypatch, how
):
    ctx, first, _ = prepared(tmp_path, "first")
    assert first["hit"] is False and loaded(ctx, monkeypatch) == FILES
    plant(how, tmp_path, first["commit"])

    nxt, record, lines = prepared(tmp_path, "next")
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(warnings) == 1 and "model.safetensors" in warnings[0] and "not used" in warnings[0], lines
    assert record["hit"] is False and record["recopied"] == ["model.safetensors"]
    assert hub.downloads[-1].endswith("/model.safetensors") and len(hub.downloads) == 4
    assert loaded(nxt, monkeypatch) == FILES  # the hub's bytes, not the planted ones
    assert prepared(tmp_path, "after")[1]["hit"] is True  # mended: the next run reads the copy


def test_a_weights_file_changed_after_the_trusted_manifest_is_refused_at_load(tmp_path, hub, monkeypatch):
    ctx, record, _ = prepared(tmp_path, "r")
    files = Path(record["dir"])
    (files / "extra.py").write_text("import os")  # not in the manifest: never copied for the loader
    assert loaded(ctx, monkeypatch) == FILES
    for name, changed in (("model.safetensors", PLANTED), ("tokenizer.json", b'{"version": "6.6"}')):
        original = (files / name).read_bytes()
        (files / name).write_bytes(changed)  # after the stage's check: only the worker's own read can tell
        with pytest.raises(
            weights_check.WeightsRefused, match=rf"base weights: {name} in .* does not match the trusted"
        ):
            loaded(ctx, monkeypatch)
        (files / name).write_bytes(original)
    (files / "config.json").unlink()
    with pytest.raises(weights_check.WeightsRefused, match="config.json is missing"):
        loaded(ctx, monkeypatch)
    monkeypatch.delenv(weights.WEIGHTS_MANIFEST_ENV)
    weights_check.release()
    with pytest.raises(weights_check.WeightsRefused, match=f"without {weights.WEIGHTS_MANIFEST_ENV}"):
        weights_check.checked_dir()


def test_the_hubs_own_hashes_are_what_is_checked_and_recorded_where_no_pod_writes(tmp_path, hub, monkeypatch):
    ctx, record, _ = prepared(tmp_path, "r")
    with urllib.request.urlopen(f"{hub.url}/api/models/{REPO}/revision/main?blobs=true") as response:
        listing = json.load(response)  # what huggingface_hub's model_info(files_metadata=True) reads
    doc = json.loads(manifest_path(tmp_path, record["commit"]).read_text())
    assert doc["commit"] == listing["sha"] == record["commit"]
    by_name = {e["name"]: e for e in doc["files"]}
    for sib in listing["siblings"]:
        line = by_name[sib["rfilename"]]
        if sib.get("lfs"):
            assert line["sha256"] == sib["lfs"]["sha256"] == hashlib.sha256(FILES[sib["rfilename"]]).hexdigest()
        else:
            assert line["git_sha1"] == sib["blobId"] == git_blob_sha1(FILES[sib["rfilename"]])
    # the revision's commit is the trusted side's record, beside the manifests, not the cache's refs/
    trusted_ref = tmp_path / cache_trust.MANIFESTS_PREFIX / weights.trusted_ref_key(REPO, "main")
    assert trusted_ref.read_text() == record["commit"]
    assert not (tmp_path / "cache" / weights.repo_key(REPO) / "refs").exists()
    passed = json.loads(base_weights.job_env(ctx)[weights.WEIGHTS_MANIFEST_ENV])  # what the workers check against
    assert passed == [{k: v for k, v in e.items() if k != "md5"} for e in doc["files"]]

    # the hub gone: a planted ref in the run-writable cache changes nothing; the trusted ref serves
    refs = tmp_path / "cache" / weights.repo_key(REPO) / "refs"
    refs.mkdir()
    (refs / "main").write_text("f" * 40)
    hub.stop()
    _, out, lines = prepared(tmp_path, "offline")
    assert (out["commit"], out["hit"]) == (record["commit"], True) and any("did not answer" in x for x in lines)
    # ... and a planted file cannot be mended without the hub: the run stops naming it, never reading the hub unchecked
    plant("bytes", tmp_path, record["commit"])
    offline = RunContext(spec=ctx.spec, run_id="planted", store=LocalStore(tmp_path / "planted"), platform="local")
    with pytest.raises(InfraError, match=r"damaged \(model.safetensors not as the trusted manifest says\)"):
        base_weights.prepare(offline, [].append)
    assert base_weights.job_env(offline) == {}


def test_a_fresh_download_that_does_not_match_the_hubs_hash_stops_the_run_naming_the_file(tmp_path, hub):
    original = hub._resolve

    def swapped(repo_id, revision, name, method, headers):  # the listing is right; the bytes served are not
        status, out, body = original(repo_id, revision, name, method, headers)
        return status, out, PLANTED if name == "model.safetensors" and method == "GET" else body

    hub._resolve = swapped  # type: ignore[method-assign]
    ctx = RunContext(
        spec=resolve("local-fsdp", {"model_id": REPO}), run_id="r", store=LocalStore(tmp_path / "r"), platform="local"
    )
    with pytest.raises(InfraError, match=r"model.safetensors of google/tiny-gemma@\w+ from .* does not match"):
        base_weights.prepare(ctx, [].append)  # never a fallback to the workers reading the hub unchecked
    assert base_weights.job_env(ctx) == {}


def test_the_jobs_get_the_trusted_manifest_not_what_the_runs_record_says(tmp_path, hub, monkeypatch):
    ctx, record, _ = prepared(tmp_path, "r")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for name, data in FILES.items():
        (elsewhere / name).write_bytes(PLANTED if name == "model.safetensors" else data)
    doc = json.loads((tmp_path / "r" / base_weights.RECORD).read_text())
    for entry in doc["entries"]:  # the run's record rewritten to vouch for other bytes in another directory
        if entry["name"] == "model.safetensors":
            entry["sha256"] = hashlib.sha256(PLANTED).hexdigest()
    (tmp_path / "r" / base_weights.RECORD).write_text(json.dumps({**doc, "dir": str(elsewhere)}))
    env = base_weights.job_env(ctx)
    assert env[weights.WEIGHTS_DIR_ENV] == record["dir"]
    assert hashlib.sha256(PLANTED).hexdigest() not in env[weights.WEIGHTS_MANIFEST_ENV]
    assert loaded(ctx, monkeypatch) == FILES
    (tmp_path / "r" / base_weights.RECORD).write_text(json.dumps({**doc, "commit": "../../elsewhere"}))
    with pytest.raises(InfraError, match="names no commit"):
        base_weights.job_env(ctx)
