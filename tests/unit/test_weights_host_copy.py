"""One checked copy of the base weights per host (``trainers.weights_check``): the first worker of a host copies and
verifies, the others wait and reuse it, the last to finish loading removes it, and a copy left by a worker killed
with SIGKILL (how Ray Train v2 ends its workers: no ``atexit``, no ``finally``) is never trusted by the next job.

Each ``_acquire`` opens its own lock files, and ``flock`` locks belong to the open file, so two acquires in one
process contend as two worker processes of one host do; the crash is a real process killed by SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainers import weights_check

FILES = {"config.json": b'{"model_type": "gemma4"}', "model.safetensors": bytes(range(256)) * 16}


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A cached copy and its trusted manifest, and a temporary directory of the host's own."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "host"))
    (tmp_path / "host").mkdir()
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    src = tmp_path / "cache"
    src.mkdir()
    for name, data in FILES.items():
        (src / name).write_bytes(data)
    entries = [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in FILES.items()]
    return src, json.dumps(entries)


def copied(files: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in Path(files).iterdir()}


def test_the_first_worker_of_a_host_copies_the_others_reuse_and_the_last_removes_it(source):
    src, manifest = source
    first = weights_check._acquire(str(src), manifest)
    (src / "model.safetensors").write_bytes(b"changed after the first worker's check")
    second = weights_check._acquire(str(src), manifest)  # reads nothing of the source: the host's checked copy
    assert second[0] == first[0] and copied(second[0]) == FILES
    assert len(list(Path(first[0]).parent.parent.iterdir())) == 1  # one directory on the host, not one per worker
    weights_check._let_go(*first)
    assert copied(second[0]) == FILES  # still loading from it
    weights_check._let_go(*second)
    assert not Path(first[0]).exists()  # the last one removed it
    with pytest.raises(weights_check.WeightsRefused, match="model.safetensors in .* does not match"):
        weights_check._acquire(str(src), manifest)  # a later copy checks the source again
    assert not Path(first[0]).exists()


def test_a_copy_left_by_a_killed_worker_is_copied_and_checked_again_never_trusted(source, tmp_path):
    src, manifest = source
    crash = (
        "import os, signal, sys\n"
        "from trainers import weights_check\n"
        "files, _ = weights_check._acquire(sys.argv[1], sys.argv[2])\n"
        "print(files, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", crash, str(src), manifest], capture_output=True, text=True, env=env)
    assert out.returncode == -signal.SIGKILL
    left = Path(out.stdout.splitlines()[-1])
    assert copied(str(left)) == FILES  # left behind: nothing removed it
    (left / "model.safetensors").write_bytes(bytes(reversed(FILES["model.safetensors"])))  # then tampered with
    (left / "extra.py").write_text("import os")
    files, use = weights_check._acquire(str(src), manifest)
    assert Path(files) == left and copied(files) == FILES  # copied and checked again
    weights_check._let_go(files, use)
    assert not left.exists()


def test_a_job_lets_go_of_the_hosts_copy_once_it_has_loaded_even_when_loading_fails(source, monkeypatch):
    src, manifest = source
    monkeypatch.setenv(weights_check.WEIGHTS_DIR_ENV, str(src))
    monkeypatch.setenv(weights_check.MANIFEST_ENV, manifest)
    with weights_check.loading():
        files = weights_check.checked_dir()
        assert weights_check.checked_dir() == files and copied(files) == FILES  # the tokenizer and the model
    assert not Path(files).exists()
    with pytest.raises(RuntimeError, match="load failed"), weights_check.loading():
        files = weights_check.checked_dir()
        raise RuntimeError("load failed")
    assert not Path(files).exists() and not weights_check._held
