"""The FSDP trainer's checkpoints across the ranks of a worker group (``trainers.ray_checkpoints``), through Ray Train
itself in the torch trainer environment (a TorchTrainer of two workers on gloo, its preemption watcher on, as on GKE):

- the restore point is rank 0's choice, handed to every rank (``restore_point``): rank 1 looks at the storage only
  after a newer checkpoint was committed there since rank 0 looked, and still restores what rank 0 chose;
- the preemption poll's wait for a slower rank is checkpoint time: rank 1's report of the save at step 9 returns late
  (Ray Train hands it to its controller after rank 0's: each worker's result queue is its own), so rank 0, whose own
  report returned at once, waits at the poll's barrier (step 10); its ``checkpoint`` event holds that wait;
- at a worker group's start rank 0 prunes what no restore needs: in a copy of the run's storage, as Ray Train left
  it (its own record of the checkpoints it registered, ``checkpoint_manager_snapshot.json``), with checkpoints a lost
  group committed and never reported and a trained model's directory it never registered, every one of those goes
  and what Ray Train registered stays, with the restore point.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

SLOW_REPORT_S = 3.0
STEPS = 11  # checkpoints every 3 steps (3, 6, 9), the poll at 10, the trained model at 11

SCRIPT = r"""
import os, sys, time
from pathlib import Path

os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "1"  # Ray Train's default, which the local platform turns off
import ray
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

root, slow_s, steps = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])


def committed(storage, step):
    from trainers import checkpoints

    directory = storage / f"{checkpoints.SHARDED_PREFIX}{step:08d}"
    directory.mkdir(parents=True)
    (directory / checkpoints.CHECKPOINT_META).write_text("{}")
    (directory / checkpoints.DCP_INDEX).write_bytes(b"index")


def loop(config):
    import ray.train
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from components.spec import protocol
    from components.workload import resolve
    from trainers import mesh, ray_checkpoints
    from trainers.checkpoints import Position
    from trainers.model import build_model, load_tokenizer

    rank = ray.train.get_context().get_world_rank()
    # The restore point. Rank 1 looks only once rank 0 is about to, and after a newer checkpoint was committed.
    picks = root / "picks"
    if rank == 0:
        (root / "rank0_looks").touch()
    else:
        while not (root / "rank0_looks").exists():
            time.sleep(0.05)
        time.sleep(2.0)
        committed(picks, 9)
    chosen = ray_checkpoints.restore_point(picks, rank)
    (root / f"chosen{rank}.txt").write_text(chosen.name if chosen else "")

    if rank == 1:  # Ray Train hands rank 1's report of the save at step 9 to its controller late
        report = ray.train.report

        def late_report(*args, **kwargs):
            report(*args, **kwargs)
            if str(kwargs.get("checkpoint_dir_name", "")).endswith("00000009"):
                time.sleep(slow_s)

        ray.train.report = late_report
    else:
        sys.stdout = open(root / "records.log", "a", buffering=1)  # rank 0's records, whole
    spec = resolve("local-fsdp", "train.checkpoint_every_steps=3")
    tokenizer = load_tokenizer(spec.train.model_id)
    model = mesh.parallelize(build_model(spec.train.model_id, tokenizer, 0), init_device_mesh("cpu", (2,)))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    saves = ray_checkpoints.Checkpointer(spec, model, optimizer, tokenizer, rank, 2)
    assert saves.watched
    tokens = torch.randint(0, len(tokenizer), (2, 16), generator=torch.Generator().manual_seed(rank))
    for step in range(1, steps + 1):
        model(input_ids=tokens, labels=tokens).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if rank == 0:
            protocol.emit("event", {"event": "step", "step": step, "time": time.time()})
        saves.after_step(Position(0, step, step), False)
    saves.final(Position(0, steps, steps), {"loss": 1.0})


committed(root / "picks", 6)
ray.init(num_cpus=4, include_dashboard=False)
TorchTrainer(
    loop,
    torch_config=TorchConfig(backend="gloo"),
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    run_config=RunConfig(
        name="ranks",
        storage_path=str(root / "ray_results"),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    ),
).fit()
ray.shutdown()
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run's directory, once the script above ran in the torch trainer environment."""
    from components.platforms.local import envs
    from components.spec import protocol
    from tests.helpers import REPO

    root = tmp_path_factory.mktemp("ranks")
    python = envs.ensure_env("torch").python
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(root), "PYTHONPATH": str(REPO)}
    env.pop(protocol.NONCE_ENV, None)
    proc = subprocess.run(
        [python, "-c", SCRIPT, str(root), str(SLOW_REPORT_S), str(STEPS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=500,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


@pytest.mark.trainer_env  # needs the torch trainer environment, which `make test` builds while the fast tiers run
def test_every_rank_restores_the_checkpoint_rank_0_chose(run):
    chosen = [(run / f"chosen{rank}.txt").read_text() for rank in (0, 1)]
    # Rank 0 looked (within the two seconds rank 1 gave it) before step 9 was committed: both restore step 6, though
    # rank 1 alone would have seen step 9. (A rank 0 slower than that would have chosen step 9 for both.)
    assert chosen[0] == chosen[1] in ("checkpoint_step00000006", "checkpoint_step00000009"), chosen
    assert (run / "picks" / "checkpoint_step00000009").is_dir()  # the newest, never pruned


@pytest.mark.trainer_env  # the module's run, in the torch trainer environment
def test_the_polls_wait_for_a_slower_ranks_report_is_checkpoint_time(run):
    from components.spec import protocol

    records = list(protocol.parse((run / "records.log").read_text().splitlines()))
    polls = [p for kind, p in records if kind == "event" and p["event"] == "checkpoint" and "poll_wait_s" in p]
    assert [p["step"] for p in polls] == [9], polls
    poll = polls[0]
    # Rank 0's own report returned at once; it waited for rank 1's at the poll's barrier, and the event holds it.
    assert poll["seconds"] == poll["poll_wait_s"] >= 0.8 * SLOW_REPORT_S, poll
    assert poll["barrier_wait_s"] >= 0.8 * SLOW_REPORT_S, poll
    assert poll["report_wait_s"] + poll["barrier_wait_s"] == pytest.approx(poll["seconds"])


@pytest.mark.trainer_env  # the module's run, in the torch trainer environment
def test_a_groups_start_prunes_checkpoints_ray_train_never_registered_and_keeps_what_a_restore_needs(
    run, tmp_path, capsys
):
    from trainers import checkpoints

    storage = tmp_path / "ranks"
    shutil.copytree(run / "ray_results" / "ranks", storage)
    registered = checkpoints.registered(storage)  # Ray Train's own record: the two newest it was reported
    assert registered == {"checkpoint_step00000009", f"{checkpoints.FINAL_PREFIX}{STEPS:08d}"}, registered

    def add(name: str, *, index: bool = True) -> None:
        directory = storage / name
        directory.mkdir()
        (directory / checkpoints.CHECKPOINT_META).write_text(json.dumps({"global_step": 0}))
        if index:
            (directory / checkpoints.DCP_INDEX).write_bytes(b"index")

    # Committed by lost groups and not in the record read: older than Ray Train's newest (pruned), newer than it (13:
    # it may be in a fresher record than this mount shows, so kept); the newest is restored.
    for step in (5, 10, 13, 14):
        add(f"{checkpoints.SHARDED_PREFIX}{step:08d}")
    add(f"{checkpoints.SHARDED_PREFIX}{15:08d}", index=False)  # a save cut short
    add(f"{checkpoints.FINAL_PREFIX}{8:08d}", index=False)  # a trained model a lost group wrote, never registered
    chosen = checkpoints.restore_point(storage, prune=True)
    assert chosen == storage / f"{checkpoints.SHARDED_PREFIX}{14:08d}"
    left = sorted(p.name for p in storage.iterdir() if p.is_dir())
    assert left == [
        "checkpoint_step00000009", "checkpoint_step00000013", "checkpoint_step00000014", f"final_{STEPS:08d}"
    ], left  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("never registered by Ray Train") == 3 and out.count("ignored uncommitted checkpoint") == 1, out

    # Where Ray Train's record cannot be read, no committed checkpoint is pruned.
    add(f"{checkpoints.SHARDED_PREFIX}{12:08d}")
    (storage / checkpoints.RAY_SNAPSHOT).write_text('{"checkpoint_results": [')  # being written
    assert checkpoints.restore_point(storage, prune=True) == chosen
    assert (storage / f"{checkpoints.SHARDED_PREFIX}{12:08d}").is_dir()
    assert "cannot be read: no committed one pruned" in capsys.readouterr().out
