"""The recurring pair through the compile cache's trusted path, on the local platform with real MaxText: the first
run's compile job fills the cache (its training job already loads every program it compiled), and the second run of
the same model, slice and image runs no compile job and loads them too; what the first run's training job wrote in
its own cache directory (a program planted over one it loaded, and one under a new name) reaches neither the cache
kept across runs nor the second run (``components.stages.compile_cache``)."""

import json
import subprocess

import pytest

from components.workload import cache
from tests.helpers import tpupipe_cmd, unique_run_id

pytestmark = pytest.mark.e2e
PLANTED = b"\x7fELF a program the training job planted" * 4
# Enough steps for the pair (every program is compiled in the first), and no answers: the decode's programs are the
# engine's own, which tests/e2e/test_local_maxtext.py's run answers with.
SHORT = "maxtext.steps=6 eval.generate_examples=0"


def run(root, run_id) -> None:
    cmd = [*tpupipe_cmd(), "run", "--preset", "local-maxtext", "--run-id", run_id, "--output-root", str(root)]
    proc = subprocess.run([*cmd, "--set", SHORT], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def train_result(root, run_id) -> dict:
    return json.loads((root / run_id / "stages" / "train.json").read_text())["result"]


def test_a_recurring_run_loads_the_compile_jobs_programs_and_never_what_a_training_job_planted(tmp_path):
    first, second = unique_run_id("cc-first"), unique_run_id("cc-second")
    run(tmp_path, first)
    one = train_result(tmp_path, first)
    made = one["compile_cache"]
    assert made["compile_job"]["compiles"] > 0 and made["recorded"]["recorded"] > 0
    hits = one["timeline"]["compile_cache"]["hits"]
    assert hits > 0  # the first run's training job already loads what its compile job compiled
    key = made["staged"]["key"]
    own = tmp_path / first / "cache" / key  # the first training job's jax_cache_dir: its pods may write there
    entries = sorted(p for p in own.rglob("*") if p.is_file())
    assert entries
    for entry in entries:
        entry.write_bytes(PLANTED)
    (own / "jit_planted-cache").write_bytes(PLANTED)

    run(tmp_path, second)
    two = train_result(tmp_path, second)
    staged = two["compile_cache"]["staged"]
    assert two["compile_cache"]["compile_job"] is None  # the configuration is recorded: no compile job
    assert staged["staged"] == made["recorded"]["recorded"] and staged["refused"] == [] and staged["unlisted"] == 0
    assert two["timeline"]["compile_cache"]["hits"] >= hits  # the recurring pair still loads the cache
    shared = tmp_path / cache.CACHE_PREFIX / key
    for where in (shared, tmp_path / second / "cache" / key):
        assert not (where / "jit_planted-cache").exists()
        assert all(p.read_bytes() != PLANTED for p in where.rglob("*") if p.is_file())
    assert "WARNING: compile cache" not in (tmp_path / second / "logs" / "pipeline.log").read_text()
