"""The FSDP trainer's preemption poll waits for the previous asynchronous save's write and report before it asks Ray
Train (``trainers.ray_checkpoints.Checkpointer.after_step``: every rank passes Ray Train's barriers in one order), and
what training waited there is checkpoint time in the goodput ledger, not a step's.

In the torch trainer environment, through Ray Train itself (a TorchTrainer of one worker, its preemption watcher on,
as on GKE): a checkpoint every 3 steps, the poll at step 10, and a storage slower than the steps (DCP's file writer
sleeps before each write: torch's ``FileSystemWriter.write_data``, the layer a slow bucket would be slow in). The
save at step 9 is still being written when the poll comes: the poll's ``checkpoint`` event carries the wait, and
the ledger's "checkpoint saves" between step 10 and step 11 hold it.

The same run's end writes the trained model once, straight into the run's storage, and Ray Train reports it there
(``Checkpointer.final``, ``CheckpointUploadMode.NO_UPLOAD``): the result's checkpoint is that directory, and the run's
directory holds one copy of the weights.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

SLOW_WRITE_S = 3.0

SCRIPT = r"""
import os, sys, time
from pathlib import Path

os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "1"  # Ray Train's default, which the local platform turns off
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

root, slow_s = Path(sys.argv[1]), float(sys.argv[2])


def loop(config):
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from torch.distributed.device_mesh import init_device_mesh

    from components.spec import protocol
    from components.workload import resolve
    from trainers import mesh, ray_checkpoints
    from trainers.checkpoints import Position
    from trainers.model import build_model, load_tokenizer

    write = FileSystemWriter.write_data

    def slow_write(self, plan, planner):  # a storage slower than the steps
        time.sleep(slow_s)
        return write(self, plan, planner)

    FileSystemWriter.write_data = slow_write
    sys.stdout = open(root / "records.log", "a", buffering=1)  # rank 0's records, whole, for the ledger below
    spec = resolve("local-fsdp", "train.checkpoint_every_steps=3")
    tokenizer = load_tokenizer(spec.train.model_id)
    model = mesh.parallelize(build_model(spec.train.model_id, tokenizer, 0), init_device_mesh("cpu", (1,)))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    saves = ray_checkpoints.Checkpointer(spec, model, optimizer, tokenizer, 0, 1)
    assert saves.watched
    protocol.emit("event", {"event": "worker_group_started", "world_size": 1, "time": time.time()})
    tokens = torch.randint(0, len(tokenizer), (2, 16))
    for step in range(1, 12):
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        protocol.emit("event", {"event": "step", "step": step, "time": time.time()})
        saves.after_step(Position(0, step, step), False)
    saves.final(Position(0, 11, 11), {"loss": 1.0})


ray.init(num_cpus=2, include_dashboard=False)
result = TorchTrainer(
    loop,
    torch_config=TorchConfig(backend="gloo"),
    scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
    run_config=RunConfig(name="poll", storage_path=str(root / "ray_results")),
).fit()
ray.shutdown()
(root / "checkpoint.txt").write_text(result.checkpoint.path)
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run's directory, once the script above ran in the torch trainer environment."""
    from components.platforms.local import envs
    from components.spec import protocol
    from tests.helpers import REPO

    root = tmp_path_factory.mktemp("checkpointer")
    python = envs.ensure_env("torch").python
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(root), "PYTHONPATH": str(REPO)}
    env.pop(protocol.NONCE_ENV, None)
    proc = subprocess.run(
        [python, "-c", SCRIPT, str(root), str(SLOW_WRITE_S)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


@pytest.mark.trainer_env  # needs the torch trainer environment, which `make test` builds while the fast tiers run
def test_the_preemption_polls_wait_for_a_slow_save_is_checkpoint_time_in_the_ledger(run):
    from components.spec import protocol
    from components.stages import goodput

    records = list(protocol.parse((run / "records.log").read_text().splitlines()))
    events = [p for kind, p in records if kind == "event"]
    polls = [p for p in events if p["event"] == "checkpoint" and "poll_wait_s" in p]
    # One poll (step 10), after the save at step 9 whose write sleeps: it waited for that write and its report, a
    # part of that save's wait (its event names the save's step).
    assert [p["step"] for p in polls] == [9], events
    assert polls[0]["seconds"] == polls[0]["poll_wait_s"] >= 0.8 * SLOW_WRITE_S, polls
    steps = {p["step"]: p["time"] for p in events if p["event"] == "step"}
    timeline = goodput.timeline(records)
    intervals = goodput.train_intervals((min(timeline["groups"]), steps[11]), timeline)
    # Between step 10's end and step 11's: the poll's wait is "checkpoint saves", the rest of the step is productive.
    around = {}
    for a, b, category in intervals:
        if steps[10] <= a and b <= steps[11]:
            around[category] = around.get(category, 0.0) + b - a
    assert around.get("checkpoint saves", 0.0) >= 0.8 * SLOW_WRITE_S, (around, intervals)
    assert around.get("productive steps", 0.0) < around["checkpoint saves"], around


@pytest.mark.trainer_env  # the module's run, in the torch trainer environment
def test_the_trained_model_is_written_once_into_the_runs_storage_and_reported_there(run):
    from trainers import ray_checkpoints
    from trainers.checkpoints import CHECKPOINT_META

    storage = run / "ray_results" / "poll"
    reported = Path((run / "checkpoint.txt").read_text())
    assert reported == storage / f"{ray_checkpoints.FINAL_PREFIX}{11:08d}", reported
    assert json.loads((reported / CHECKPOINT_META).read_text())["final"] is True
    # One copy of the trained weights in the run's directory: none made by an upload from a temporary directory.
    assert [p.relative_to(storage) for p in storage.rglob("model.safetensors")] == [
        reported.relative_to(storage) / "model.safetensors"
    ]
