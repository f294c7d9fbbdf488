"""The train job's own figure is the evaluation job's: a model trained a few steps, measured where it is as the train
job's last epoch measures it (``trainers.heldout.InJob.after``), then saved as the trainer saves its final checkpoint
and measured again as the evaluation job does (``trainers.model.load_trained`` of the checkpoint, sharded again,
``trainers.heldout.loss``): the same held-out loss to the tolerance of the loss, on the same evaluation key. Run in the
torch trainer environment (seconds: one process, a one-rank gloo group, no Ray)."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

pytestmark = pytest.mark.trainer_env  # the torch trainer environment, which `make test` builds beside the fast tiers

SCRIPT = r"""
import json, os, sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from components.workload import resolve
from trainers import data, heldout, mesh
from trainers.checkpoints import save_final
from trainers.devices import Worker
from trainers.model import build_model, load_tokenizer, load_trained

root = Path(sys.argv[1])
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
spec = resolve("local-fsdp", "num_train_examples=64 num_eval_examples=40")
t = spec.train
device = torch.device("cpu")
config = {"data_files": data.job_files(spec, root), "cache_dir": str(root / "cache")}
tokenizer = load_tokenizer(t.model_id)
model = mesh.parallelize(build_model(t.model_id, tokenizer, t.seed, torch.float32), init_device_mesh("cpu", (1,)))
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=t.learning_rate)
train = data.tokenize(data.load_split(t.dataset, "train", config["data_files"], config["cache_dir"]), tokenizer,
                      t.max_length)
model.train()
for step in range(4):
    mesh.train_step(model, optimizer, train[step * t.batch_size : (step + 1) * t.batch_size], device)
in_job = heldout.InJob(spec, config, tokenizer, Worker(0, 1, "cpu", device)).after(model)
checkpoint = root / "checkpoint"
checkpoint.mkdir()
save_final(model, tokenizer, {"epoch": 0, "global_step": 4}, 0, checkpoint)
split = heldout.Split(spec, config, tokenizer, Worker(0, 1, "cpu", device))
reloaded = load_trained(t.model_id, str(checkpoint), tokenizer, t.seed, torch.float32)
reloaded = mesh.parallelize(reloaded, init_device_mesh("cpu", (1,)))
untrained = mesh.parallelize(build_model(t.model_id, tokenizer, t.seed, torch.float32), init_device_mesh("cpu", (1,)))
print("FACTS " + json.dumps({"in_job": in_job, "job": heldout.loss(reloaded, split.batches, device),
                             "job_key": split.key, "untrained": heldout.loss(untrained, split.batches, device)}))
"""


def test_the_train_jobs_own_figure_is_the_evaluation_jobs_for_the_same_checkpoint(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("torch").python
    env = {
        "PATH": "/usr/bin:/bin",
        "TORCH_DEVICE_BACKEND_AUTOLOAD": "0",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO),
    }
    with socket.socket() as s:  # the one-rank gloo group's rendezvous port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run(
        [python, "-c", SCRIPT, str(tmp_path), str(port)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    in_job = facts["in_job"]
    assert in_job["eval_key"] == facts["job_key"] and in_job["num_eval_examples"] == 40
    assert in_job["eval_loss"] == pytest.approx(facts["job"], rel=1e-6)
    assert in_job["eval_loss"] < facts["untrained"]  # it trained: a figure of the model as it is, not as built
    assert '"event": "eval"' in proc.stdout and '"which": "after"' in proc.stdout  # rank 0's record of it
