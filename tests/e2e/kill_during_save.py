"""Kill the FSDP trainer's ranks during a sharded save, at a seeded random point of the write, then resume: the
fault injection of ``tests/e2e/test_kill_during_save.py`` and ``make bench BENCH=kill_save`` (N trials).

Run in the torch trainer environment: ``python kill_during_save.py ROOT TRIALS SEED``. Each trial trains the tiny
scratch model on 2 gloo ranks (processes of this machine forked from this one, no Ray), with the trainer's own saver
(``trainers.checkpoints.AsyncSaver``: the copy to host memory, then DCP's background write) every PERIOD steps into
directories named as the trainer names them, and with each step's loss appended to a log by rank 0. One rank
SIGKILLs itself at a seeded point of one save's write: before the k-th of the items its plan writes (k drawn from 0
to all of them), or, on rank 0, with every shard and ``.metadata.tmp`` written but before DCP renames the index into
place (``FileSystemWriter.finish``). The other rank is then killed by the spawner. A new group, of 1, 2 or 3 ranks
(drawn: DCP reshards), resumes as the trainer does (``checkpoints.newest_sharded`` with pruning on rank 0, then
``checkpoints.load_sharded``), trains to the end and its loss is compared with an uninterrupted run's. Prints one
``TRIAL`` JSON line per trial and a ``FACTS`` line.

The fault is injected into torch's writer (the library's code, not the trainer's): the trainer's code runs as it is.
"""

import json
import os
import random
import signal
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint import filesystem
from torch.distributed.device_mesh import init_device_mesh

from trainers import checkpoints, mesh
from trainers.model import build_model, load_tokenizer, load_trained

SCRATCH = "scratch:gemma4-tiny"
STEPS, PERIOD = 12, 3


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch(step: int, vocab: int):
    gen = torch.Generator().manual_seed(step)
    return torch.randint(0, vocab, (2, 16), generator=gen)  # the same batch on every rank: any world trains alike


def inject(kill: dict, rank: int) -> None:
    """SIGKILL this process at ``kill``'s point of the write of the save at step ``kill['step']``."""
    if kill.get("rank") != rank:
        return
    write_data, rename = filesystem.FileSystemWriter.write_data, filesystem.FileSystem.rename

    def dying_write(self, plan, planner):
        if Path(self.path).name.endswith(f"{kill['step']:08d}"):
            at = int(kill["fraction"] * (len(plan.items) + 1))  # 0 .. all items: every point of this rank's write
            if at < len(plan.items):
                write_item = filesystem._write_item
                written = [0]

                def counted(*args, **kwargs):
                    if written[0] == at:
                        os.kill(os.getpid(), signal.SIGKILL)
                    written[0] += 1
                    return write_item(*args, **kwargs)

                filesystem._write_item = counted
            elif rank != 0:  # every item written; killed before its results reach the coordinator
                write_data(self, plan, planner).wait()
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                kill["at_rename"] = True
        return write_data(self, plan, planner)

    def dying_rename(self, path, new_path):
        if kill.get("at_rename") and str(path).endswith(".metadata.tmp"):
            os.kill(os.getpid(), signal.SIGKILL)  # every shard and the index's temporary file written, not renamed
        return rename(self, path, new_path)

    filesystem.FileSystemWriter.write_data = dying_write
    filesystem.FileSystem.rename = dying_rename


def worker(rank: int, world: int, port_: int, root: str, kill: dict, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port_))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    storage = Path(root)
    tokenizer = load_tokenizer(SCRATCH)
    model = mesh.parallelize(build_model(SCRATCH, tokenizer, 0), init_device_mesh("cpu", (world,)), None)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    newest = checkpoints.newest_sharded(storage, prune=rank == 0)
    start = checkpoints.load_sharded(model, optimizer, newest)["global_step"] if newest else 0
    if rank == 0:
        out["restored"] = newest.name if newest else None
        out["restored_start"] = start
    inject(kill, rank)
    saver = checkpoints.AsyncSaver(background_staging=True)
    saver.guard(optimizer)
    log = open(storage / "steps.log", "a") if rank == 0 else None
    for step in range(start + 1, STEPS + 1):
        ids = batch(step, len(tokenizer))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if log:
            log.write(f"{step} {float(loss)}\n")
            log.flush()  # in the kernel's hands: a SIGKILL loses nothing written
        if step % PERIOD == 0 and step < STEPS:
            meta = {"epoch": 0, "epoch_step": step, "global_step": step, "world": world}
            saver.save(model, optimizer, meta, rank, storage / f"{checkpoints.SHARDED_PREFIX}{step:08d}")
    saver.close()
    if rank == 0:
        out["final_loss"] = float(loss)
    dist.destroy_process_group()


def run(root: Path, world: int, kill: dict) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    out = mp.Manager().dict()
    try:
        # Forked, not spawned: each rank starts with this process's imports (torch's, the trainer's) instead of
        # importing them again; the trainer's code runs as it is.
        mp.start_processes(worker, args=(world, port(), str(root), kill, out), nprocs=world, start_method="fork")
    except (mp.ProcessExitedException, mp.ProcessRaisedException):  # the killed rank, or its peer; spawn ends all
        pass
    return {**out, "killed": "final_loss" not in out}


def steps_run(root: Path) -> list[int]:
    return [int(line.split()[0]) for line in (root / "steps.log").read_text().splitlines()]


def committed_now(root: Path) -> dict[str, bool]:
    """Each checkpoint directory and whether its index is in place, read before the resume touches anything."""
    return {d.name: (d / ".metadata").is_file() for d in sorted(root.glob(f"{checkpoints.SHARDED_PREFIX}*"))}


def main() -> None:
    root, trials, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    draw = random.Random(seed)
    reference = run(root / "reference", 2, {})
    results = []
    for trial in range(trials):
        where = root / f"trial{trial}"
        saves = [s for s in range(PERIOD, STEPS, PERIOD)]
        kill = {"step": draw.choice(saves), "rank": draw.randrange(2), "fraction": draw.random()}
        killed = run(where, 2, dict(kill))
        before = committed_now(where)
        ran_before = steps_run(where)
        world = draw.choice([1, 2, 3])
        resumed = run(where, world, {})
        restored = resumed["restored"]
        result = {
            "kill": kill,
            "killed": killed["killed"],
            "committed_before_resume": before,
            "resume_world": world,
            "restored": restored,
            "restored_committed": before.get(restored, False) if restored else None,
            "last_step_before_kill": max(ran_before, default=0),
            "steps_repeated": max(ran_before, default=0) - resumed["restored_start"],
            "left_after_resume": committed_now(where),
            "final_loss": resumed.get("final_loss"),
            "reference_loss": reference["final_loss"],
        }
        print("TRIAL " + json.dumps(result), flush=True)
        results.append(result)
    final = root / "final-cut-short"  # a trained model whose save stopped before its meta: never loaded
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"part")
    try:
        load_trained(SCRATCH, str(final), None, 0)
        refused = ""
    except checkpoints.UncommittedCheckpoint as e:
        refused = str(e)
    facts = {"period": PERIOD, "steps": STEPS, "trials": results, "final_refused": refused}
    print("FACTS " + json.dumps(facts), flush=True)


if __name__ == "__main__":
    main()
