"""The FSDP trainer's sharded checkpoints (``trainers.checkpoints``), in the torch trainer environment on gloo ranks
of this machine (seconds; no Ray):

- elastic: a checkpoint written by 2 ranks restores onto 1 and onto 3 with the same loss, and the optimizer state
  comes back with it (one more step after the restore gives the loss the 2 ranks' own next step gave);
- safe: a resume runs no code planted in the checkpoint's directory: a planted pickle as DCP's index, or as one of
  its non-tensor items, is refused with a clear error before it runs.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.trainer_env  # the torch trainer environment, which `make test` builds beside the fast tiers

SCRIPT = r"""
import json, os, socket, sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from trainers import checkpoints, mesh
from trainers.model import build_model, load_tokenizer

ROOT = Path(sys.argv[1])
SCRATCH = "scratch:gemma4-tiny"


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank, world, seed):
    tokenizer = load_tokenizer(SCRATCH)
    model = mesh.parallelize(build_model(SCRATCH, tokenizer, seed), init_device_mesh("cpu", (world,)), None)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tokenizer), (2, 16), generator=gen)  # the same batch on every rank
    return model, optimizer, ids


def step(model, optimizer, ids):
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def loss(model, ids):
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


class Planted:
    def __reduce__(self):
        return (os.mkdir, (str(ROOT / "code-ran"),))


def worker(rank, world, port_, mode, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port_))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    if mode == "save":
        model, optimizer, ids = setup(rank, world, seed=0)
        step(model, optimizer, ids)
        saver = checkpoints.AsyncSaver()
        saver.save(model, optimizer, {"epoch": 0, "epoch_step": 1, "global_step": 1, "world": world}, rank,
                   ROOT / "saved")
        saver.wait()
        saved = loss(model, ids)
        step(model, optimizer, ids)
        out[mode] = [saved, loss(model, ids)]
        # The same state, one hyperparameter a planted object: refused when a resume reads it.
        state = checkpoints.sharded_state(model, optimizer)
        state["optim"]["param_groups"][0]["lr"] = Planted()
        dcp.save(state, checkpoint_id=str(ROOT / "planted-item"))
        if rank == 0:
            (ROOT / "planted-item" / checkpoints.CHECKPOINT_META).write_text(json.dumps({"optimizer": True}))
    else:
        model, optimizer, ids = setup(rank, world, seed=0)  # the base model: the saved one is a step on
        fresh = loss(model, ids)
        meta = checkpoints.load_sharded(model, optimizer, ROOT / "saved")
        restored = loss(model, ids)
        step(model, optimizer, ids)
        out[f"{mode}{rank}"] = [fresh, restored, loss(model, ids), meta["global_step"]]
    dist.destroy_process_group()


def refused(directory):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port()}", rank=0, world_size=1)
    model, optimizer, _ = setup(0, 1, seed=0)
    try:
        checkpoints.load_sharded(model, optimizer, directory)
        return None
    except checkpoints.UnsafeCheckpoint as e:
        return str(e)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    out = mp.Manager().dict()
    mp.spawn(worker, args=(2, port(), "save", out), nprocs=2)
    for world in (1, 3):
        mp.spawn(worker, args=(world, port(), f"world{world}:", out), nprocs=world)
    import shutil
    planted_index = ROOT / "planted-index"
    shutil.copytree(ROOT / "saved", planted_index)
    import pickle

    (planted_index / ".metadata").write_bytes(pickle.dumps(Planted()))
    facts = dict(out)
    facts["refused_index"] = refused(planted_index)
    facts["refused_item"] = refused(ROOT / "planted-item")
    facts["ran"] = (ROOT / "code-ran").exists()
    facts["files"] = sorted(os.listdir(ROOT / "saved"))
    print("FACTS " + json.dumps(facts))
"""


def test_sharded_checkpoints_restore_onto_another_number_of_ranks_and_refuse_planted_code(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("torch").python
    script = tmp_path / "checkpoint_facts.py"  # a file: torch.multiprocessing's spawn re-imports the main module
    script.write_text(SCRIPT)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(tmp_path)}
    proc = subprocess.run(
        [python, str(script), str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    # Each of the 2 ranks wrote its own shard file; rank 0 the index and the trainer's meta.
    assert facts["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp", "tpupipe_checkpoint.json"]
    saved, next_step = facts["save"]
    for key in ("world1:0", "world3:0", "world3:1", "world3:2"):
        fresh, restored, after, global_step = facts[key]
        assert abs(fresh - saved) > 1e-2, facts  # the base model: the restore is what makes them equal
        assert restored == pytest.approx(saved, abs=1e-5), (key, facts)
        # AdamW's moments and step came back: a fresh optimizer's step from the same weights goes elsewhere.
        assert after == pytest.approx(next_step, abs=1e-4), (key, facts)
        assert global_step == 1
    assert facts["ran"] is False
    assert facts["refused_index"].startswith(f"refusing to load {tmp_path / 'planted-index' / '.metadata'}: ")
    assert "posix.mkdir" in facts["refused_index"] or "os.mkdir" in facts["refused_index"], facts["refused_index"]
    assert facts["refused_item"].startswith("refusing to load optim.param_groups"), facts["refused_item"]
    assert "weights_only=True" in facts["refused_item"]
