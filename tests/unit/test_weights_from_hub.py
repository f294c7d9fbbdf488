"""The hub emulator against huggingface_hub's own client, and the trainer reading a cached copy, in the torch trainer
environment (seconds; no Ray):

- huggingface_hub reads from the emulator what it reads from the hub: ``model_info(files_metadata=True)`` (the
  commit, each file's size, blob id and LFS sha256), ``get_hf_file_metadata`` (X-Repo-Commit, the etag from
  X-Linked-Etag or ETag, the size) and ``hf_hub_download``'s checked download;
- the tiny composite checkpoint (``tests/tiny_gemma4.py``) copied once into a cache by
  ``components.workload.weights.ensure``, then, with the hub stopped and no token, the trainer's
  ``build_model``/``load_tokenizer`` of the hub name read the copy (``TPUPIPE_WEIGHTS_DIR``, checked against the
  trusted manifest in ``TPUPIPE_WEIGHTS_MANIFEST`` as it is read) and give the same model as the checkpoint's own
  directory; a weights file changed afterwards is refused at load.
"""

from __future__ import annotations

import os
import subprocess

import pytest

pytestmark = pytest.mark.trainer_env  # the torch trainer environment, which `make test` builds beside the fast tiers

SCRIPT = r"""
import hashlib, os, sys
from pathlib import Path

ROOT = Path(sys.argv[1])
from tests.emulators.hfhub import HubEmulator, directory_files, git_blob_sha1
from tests.tiny_gemma4 import build

REPO = "google/gemma-4-E2B-it"
hub = HubEmulator()
url = hub.start()
os.environ.pop("HF_TOKEN", None)
os.environ["HF_ENDPOINT"] = url  # read when huggingface_hub is first imported (constants.py): before build's imports
model_dir = build(str(ROOT / "model"))
files = directory_files(model_dir)
commit = hub.repo(REPO).push(files)
hub.repo(REPO).gated = True
hub.lfs_redirect = True  # a weights file comes from another host, as the hub sends it

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
from huggingface_hub.errors import GatedRepoError

# a gated model: listed to anyone, its files refused without a token (401) and to an account without access (403)
assert HfApi(endpoint=url).model_info(REPO, files_metadata=True).gated == "auto"
for token, status in ((False, 401), ("hf_someone_else", 403)):
    try:
        hf_hub_download(REPO, "config.json", cache_dir=str(ROOT / "refused"), token=token)
        raise SystemExit(f"a gated model's file was given to token={token!r}")
    except GatedRepoError as exc:
        assert exc.response.status_code == status, (token, exc.response.status_code)
info = HfApi(endpoint=url, token=hub.token).model_info(REPO, files_metadata=True)
assert info.sha == commit, (info.sha, commit)
by_name = {s.rfilename: s for s in info.siblings}
assert set(by_name) == set(files)
weights_file = by_name["model.safetensors"]
lfs_sha = hashlib.sha256(files["model.safetensors"]).hexdigest()
assert weights_file.lfs is not None and weights_file.lfs.sha256 == lfs_sha
assert by_name["config.json"].lfs is None and by_name["config.json"].blob_id == git_blob_sha1(files["config.json"])
meta = get_hf_file_metadata(hf_hub_url(REPO, "model.safetensors", endpoint=url), token=hub.token)
assert meta.commit_hash == commit and meta.etag == lfs_sha and meta.size == len(files["model.safetensors"])
meta = get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=url), token=hub.token)
assert meta.etag == git_blob_sha1(files["config.json"]), meta
path = hf_hub_download(REPO, "model.safetensors", cache_dir=str(ROOT / "hf"), token=hub.token)
assert Path(path).read_bytes() == files["model.safetensors"]

from components.workload import cache_trust, weights

cache = weights.LocalCache(ROOT / "cache"), cache_trust.LocalPlace(ROOT / "trusted")
out = weights.ensure(*cache, REPO, "main", hub.token, print, hub=url)
assert out["hit"] is False and out["commit"] == commit
hub.stop()

import torch
from trainers.model import build_model, load_pretrained, load_tokenizer

out = weights.ensure(*cache, REPO, "main", None, print, hub=url)  # the hub gone, no token: the copy serves
assert out["hit"] is True
os.environ["HF_HUB_OFFLINE"] = "1"  # and anything reaching for the hub would fail
os.environ[weights.WEIGHTS_DIR_ENV] = weights.files_dir(str(ROOT / "cache"), REPO, commit)
os.environ[weights.WEIGHTS_MANIFEST_ENV] = weights.manifest_env(out["entries"])
tokenizer = load_tokenizer(REPO)
cached = build_model(REPO, tokenizer, seed=0)
direct = load_pretrained(model_dir)
a, b = cached.state_dict(), direct.state_dict()
assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
assert cached.config.get_text_config().num_hidden_layers == 2
# a weights file changed after the trusted manifest: the next process refuses to load it, naming the file
from trainers import weights_check

stored = Path(os.environ[weights.WEIGHTS_DIR_ENV]) / "model.safetensors"
stored.write_bytes(stored.read_bytes()[:-8] + bytes(8))
weights_check.release()  # a fresh process
try:
    build_model(REPO, tokenizer, seed=0)
    raise SystemExit("a changed weights file was loaded")
except weights_check.WeightsRefused as exc:
    assert "model.safetensors" in str(exc), exc
print("OK", commit)
"""


def test_huggingface_hub_reads_the_emulator_and_the_trainer_reads_the_cached_copy(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    proc = subprocess.run(
        [envs.ensure_env("torch").python, "-c", SCRIPT, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "OK" in proc.stdout
