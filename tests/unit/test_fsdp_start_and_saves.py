"""What the FSDP trainer keeps across runs and how its saves stay off the training's path:

- the tokenised training split is kept under the run's cache (``trainers.data.tokenize``), named by a key that
  changes with the examples, the tokenizer and the length (and lives in a directory keyed by the image and the
  model: ``components.workload.cache``), so a changed input is never served a stale split; a damaged entry is a miss
  with a warning, tokenised again and rewritten, never a failed run;
- a checkpoint whose copy to host memory runs while the next step computes (``trainers.checkpoints.AsyncSaver`` with
  background staging) holds the state as it was when the save began: the next optimizer step waits for the copy.

The key and the job's command line here (milliseconds); the rest in the torch trainer environment (seconds: one
process, a one-rank gloo group, no Ray).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from components.workload import resolve
from components.workload.derive import job_command
from trainers import data

TOKENIZER = {"class": "PreTrainedTokenizerFast", "name": "", "padding_side": "right", "pad_token_id": 0, "vocab": "v1"}


@pytest.mark.parametrize(
    "change",
    [
        {"examples": "sha256:other"},
        {"tokenizer": {**TOKENIZER, "vocab": "v2"}},
        {"tokenizer": {**TOKENIZER, "name": "google/gemma-4-E2B-it"}},
        {"tokenizer": {**TOKENIZER, "padding_side": "left"}},
        {"max_length": 128},
    ],
)
def test_the_tokenised_splits_key_changes_with_the_examples_the_tokenizer_and_the_length(change):
    base = {"examples": "sha256:one", "tokenizer": TOKENIZER, "max_length": 64}
    assert data.tokenized_key(**base) == data.tokenized_key(**dict(base))
    assert data.tokenized_key(**{**base, **change}) != data.tokenized_key(**base)


def test_the_fsdp_train_job_carries_the_runs_cache_and_the_other_jobs_do_not():
    spec = resolve("local-fsdp")
    train = job_command(spec, "train", "/out", "run", compile_cache="/root/cache/compile/x")
    assert "--compile-cache /root/cache/compile/x" in train
    assert "--compile-cache" not in job_command(spec, "eval", "/out", "run", "/ckpt", compile_cache="/c")
    assert "--compile-cache" not in job_command(spec, "train", "/out", "run")


def test_torch_tpus_compile_cache_is_opt_in_and_then_kept_in_the_runs_cache():
    from trainers import fsdp

    assert resolve("gemma4-e2b-v6e-16").train.torch_tpu_compile_cache is False  # off unless turned on
    cache = "/cache/compile/m/v6e-4x4-1-slice/abc"
    assert fsdp._with_compile_cache({"env_vars": {"A": "1"}}, "tpu", cache, False) == {"env_vars": {"A": "1"}}
    env = fsdp._with_compile_cache({"env_vars": {"A": "1"}}, "tpu", cache, True)  # train.torch_tpu_compile_cache=true
    assert env["env_vars"] == {"A": "1", fsdp.TORCH_TPU_CACHE_ENV: f"{cache}/torch_tpu"}
    assert fsdp._with_compile_cache({}, "cpu", "/cache/x", True) == {}  # nothing compiles on the CPU
    assert fsdp._with_compile_cache({}, "tpu", "", True) == {}  # no cache kept: nothing set


SCRIPT = r"""
import json, os, sys, warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from trainers import checkpoints, data, mesh
from trainers.model import build_model, load_tokenizer

root = Path(sys.argv[1])
facts = {}
tokenizer = load_tokenizer("scratch:gemma4-tiny")
files = data.write_generated(root / "data", 64, 8, 0)  # prompts of up to 58 tokens: lengths leave room
examples = data.load_split("generated", "train", files)
cache = str(root / "cache")
fresh = data.tokenize(examples, tokenizer, 96)
first = data.tokenize(examples, tokenizer, 96, cache)
second = data.tokenize(examples, tokenizer, 96, cache)
facts["hits"] = [first.cached, second.cached]
facts["same"] = all(torch.equal(fresh.columns[k], second.columns[k]) for k in fresh.columns)
facts["batch"] = list(second[[3, 1]]["labels"].shape)
facts["other_length"] = data.tokenize(examples, tokenizer, 80, cache).cached
entries = sorted((root / "cache" / data.TOKENIZED_DIR).iterdir())
facts["entries"] = len(entries)
for entry in entries:
    entry.write_bytes(entry.read_bytes()[:300])  # damaged: cut short
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    damaged = data.tokenize(examples, tokenizer, 96, cache)
facts["damaged"] = [damaged.cached, all(torch.equal(fresh.columns[k], damaged.columns[k]) for k in fresh.columns)]
facts["warnings"] = [str(w.message) for w in caught]
facts["rewritten"] = data.tokenize(examples, tokenizer, 96, cache).cached

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
model = mesh.parallelize(build_model("scratch:gemma4-tiny", tokenizer, 0), init_device_mesh("cpu", (1,)))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
batch = fresh[list(range(4))]
mesh.train_step(model, optimizer, batch, "cpu")


def weights(of):
    state = checkpoints.sharded_state(of, None)["model"]
    return {k: (v.to_local() if hasattr(v, "to_local") else v).clone() for k, v in state.items()}


saver = checkpoints.AsyncSaver(background_staging=True)
waits = []
saver.guard(optimizer, waits.append)
saved = weights(model)
saver.save(model, optimizer, {"epoch": 0, "epoch_step": 1, "global_step": 1, "world": 1}, 0, root / "saved")
mesh.train_step(model, optimizer, batch, "cpu")  # its optimizer step waits for the copy, then changes the weights
saver.close()
facts["waits"] = len(waits)
moved = weights(model)
facts["stepped"] = any(not torch.equal(saved[k], moved[k]) for k in saved)
restored = mesh.parallelize(build_model("scratch:gemma4-tiny", tokenizer, 1), init_device_mesh("cpu", (1,)))
checkpoints.load_sharded(restored, None, root / "saved", group=saver.group)  # DCP's collectives on its gloo group
back = weights(restored)
facts["restored_as_saved"] = all(torch.equal(saved[k], back[k]) for k in saved)
sync = checkpoints.AsyncSaver(asynchronous=False)  # train.checkpoint_staging=sync: written before save returns
parts = sync.save(model, optimizer, {"epoch": 0, "epoch_step": 2, "global_step": 2, "world": 1}, 0, root / "sync")
facts["sync"] = [sorted(parts), checkpoints.is_sharded(root / "sync"), sync.pending.done()]
sync.close()
again = mesh.parallelize(build_model("scratch:gemma4-tiny", tokenizer, 2), init_device_mesh("cpu", (1,)))
checkpoints.load_sharded(again, None, root / "sync", group=sync.group)
facts["sync_restored"] = all(torch.equal(moved[k], v) for k, v in weights(again).items())
dist.destroy_process_group()
print("FACTS " + json.dumps(facts))
"""


@pytest.mark.trainer_env  # needs the torch trainer environment, which `make test` builds while the fast tiers run
def test_a_tokenised_split_is_kept_across_runs_and_a_save_holds_the_state_it_began_with(tmp_path):
    import socket

    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("torch").python
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path), str(port)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    assert facts["hits"] == [False, True] and facts["same"] and facts["batch"] == [2, 96]
    assert facts["other_length"] is False and facts["entries"] == 2  # another length: an entry of its own
    assert facts["damaged"] == [False, True]  # a damaged entry: tokenised again, the same tensors
    assert any("ignoring the cached tokenised split" in w for w in facts["warnings"]), facts["warnings"]
    assert facts["rewritten"] is True
    assert facts["waits"] == 1 and facts["stepped"] and facts["restored_as_saved"], facts
    # The synchronous fallback: complete (DCP's index committed) when save returns, nothing in flight, restorable.
    assert facts["sync"] == [["previous_s", "state_s", "write_s"], True, True] and facts["sync_restored"], facts


@pytest.mark.parametrize(
    ("staging", "on_cpu", "expected"),
    [("auto", True, True), ("auto", False, False), ("async", False, True), ("sync", True, False)],
)
def test_sharded_saves_are_asynchronous_only_where_that_path_has_run_unless_the_spec_says(staging, on_cpu, expected):
    from trainers import ray_checkpoints

    spec = resolve("local-fsdp", f"train.checkpoint_staging={staging}")
    assert ray_checkpoints.asynchronous(spec, on_cpu) is expected


def test_an_unknown_checkpoint_staging_is_refused_naming_the_field():
    from components.spec import SpecError

    with pytest.raises(SpecError, match="train.checkpoint_staging"):
        resolve("local-fsdp", "train.checkpoint_staging=later")
