"""Kill MaxText during an Orbax save, then resume: the fault injection of ``tests/e2e/test_kill_during_save.py`` for
the MaxText trainer. Run in the maxtext trainer environment: ``python maxtext_kill_during_save.py ROOT TRIALS SEED``.

Each trial runs MaxText's own ``train.main`` (the tiny scratch model of the local-maxtext preset, synthetic data,
one process of 4 CPU devices, no Ray) with a checkpoint every PERIOD steps, and SIGKILLs it at a seeded point of one
save: after the first or second of its items' writes began (the arrays are then written in Orbax's background
threads), or with every item written and the step's ``<step>.orbax-checkpoint-tmp`` directory not yet renamed to
``<step>`` (``AtomicRenameTemporaryPath.finalize``). Then MaxText is started again on the same directory: before it,
``trainers.maxtext_train.latest_checkpoint`` names the step it will restore and prunes the cut-short one, as the
trainer's rank 0 does. Prints one ``TRIAL`` JSON line per trial and a ``FACTS`` line.

The fault is injected into Orbax (the library's code): MaxText and the trainer's code run as they are.
"""

import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

STEPS, PERIOD = 10, 3
RUN = "kill"
ARGS = [
    "dataset_type=synthetic",
    "per_device_batch_size=2",
    "max_target_length=64",
    "model_name=default",
    "decoder_block=llama2",
    "base_emb_dim=64",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "base_mlp_dim=128",
    "base_num_decoder_layers=2",
    "head_dim=16",
    "vocab_size=256",
    f"steps={STEPS}",
    "ici_fsdp_parallelism=4",
    "learning_rate=0.003",
    f"checkpoint_period={PERIOD}",
    "max_num_checkpoints_to_keep=10",
    f"run_name={RUN}",
    "log_config=false",
    "hardware=cpu",
    "skip_jax_distributed_system=true",
    "attention=dot_product",
    "dtype=float32",
    "enable_tensorboard=false",
    "grain_worker_count=0",
]


def inject(kill: dict) -> None:
    """SIGKILL this process at ``kill``'s point of the save of step ``kill['step']``."""
    from orbax.checkpoint._src.handlers import pytree_checkpoint_handler
    from orbax.checkpoint._src.path import atomicity

    handler = pytree_checkpoint_handler.PyTreeCheckpointHandler
    save, finalize = handler.async_save, atomicity.AtomicRenameTemporaryPath.finalize
    begun = [0]

    def ours(path) -> bool:
        return re.search(rf"(^|/){kill['step']}\.orbax-checkpoint-tmp", str(path)) is not None

    async def dying_save(self, directory, *args, **kwargs):
        futures = await save(self, directory, *args, **kwargs)
        if ours(directory):
            begun[0] += 1
            if begun[0] == kill["after_items"]:  # this item's arrays are being written in the background
                os.kill(os.getpid(), signal.SIGKILL)
        return futures

    async def dying_finalize(self, *args, **kwargs):
        if ours(self.get()):  # every item written; the directory not yet renamed to its step
            os.kill(os.getpid(), signal.SIGKILL)
        return await finalize(self, *args, **kwargs)

    handler.async_save = dying_save
    atomicity.AtomicRenameTemporaryPath.finalize = dying_finalize


def child(root: str, kill: dict) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    from absl import flags
    from absl import logging as absl_logging
    from maxtext.trainers.pre_train import train

    absl_logging.set_verbosity(absl_logging.INFO)  # MaxText's step and restore lines

    from trainers.maxtext_train import base_yml, latest_checkpoint

    picked = latest_checkpoint(Path(root), RUN, prune=True)  # as the trainer's rank 0, before MaxText starts
    print("PICKED " + json.dumps(picked.name if picked else None), flush=True)
    if kill:
        inject(kill)
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    train.main(["train", base_yml(), f"base_output_directory={root}", *ARGS])


def steps_of(text: str) -> list[int]:
    return [int(m) for m in re.findall(r"completed step: (\d+)", text)]


def restored_of(text: str) -> int | None:
    found = re.findall(r"restoring from this run's directory step (\d+)", text)  # maxtext/common/checkpointing.py
    return int(found[-1]) if found else None


def start(root: Path, kill: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, __file__, "child", str(root), json.dumps(kill)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def committed_now(root: Path) -> dict[str, bool]:
    """Each step directory and whether it has its final name, read before the resume touches anything."""
    saved = root / RUN / "checkpoints"
    names = sorted(p.name for p in saved.iterdir() if p.is_dir() and p.name[0].isdigit()) if saved.is_dir() else []
    return {name: name.isdigit() for name in names}


def main() -> None:
    root, trials, seed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    draw = random.Random(seed)
    results = []
    for trial in range(trials):
        where = root / f"trial{trial}"
        saves = list(range(PERIOD, STEPS - 1, PERIOD))
        kill = {"step": draw.choice(saves), "after_items": draw.choice([1, 2, 0])}  # 0: at the rename
        killed = start(where, kill)
        before = committed_now(where)
        resumed = start(where, {})
        ran_before, ran_after = steps_of(killed.stdout + killed.stderr), steps_of(resumed.stdout + resumed.stderr)
        picked = json.loads(next(line for line in resumed.stdout.splitlines() if line.startswith("PICKED "))[7:])
        result = {
            "kill": kill,
            "killed": killed.returncode == -signal.SIGKILL,
            "committed_before_resume": before,
            "picked": picked,
            "picked_committed": before.get(picked, False) if picked else None,
            "last_step_before_kill": max(ran_before, default=-1),
            "first_step_after_resume": min(ran_after, default=None),
            "restored_step": restored_of(resumed.stdout + resumed.stderr),
            "resumed_rc": resumed.returncode,
            "left_after_resume": committed_now(where),
            "reported": [line for line in resumed.stdout.splitlines() if line.startswith("ignored uncommitted")],
        }
        if resumed.returncode != 0:
            result["resumed_tail"] = (resumed.stdout + resumed.stderr)[-3000:]
        print("TRIAL " + json.dumps(result), flush=True)
        results.append(result)
    print("FACTS " + json.dumps({"period": PERIOD, "steps": STEPS, "trials": results}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "child":
        child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        main()
