"""MaxText through JaxTrainer on the local platform: 2 emulated hosts x 2 CPU devices as one JAX runtime, and
an emulated host lost mid-run (a preempted Spot VM whose replacement does not come in time) that the elastic run
survives on fewer workers, in one run."""

import json
import os
import signal
import subprocess

import pytest

from components.platforms.local.processes import run_processes
from components.spec import protocol
from tests.helpers import assert_goodput_accounts, tpupipe_cmd, unique_run_id, wait_until
from trainers import maxtext_data

pytestmark = pytest.mark.e2e
# The lost-host run: the host is killed at its first checkpoint (step 10), two checkpoint periods before the end.
LOST_HOST_STEPS = 30
MAX_LOST_STEPS = 10  # the preset's maxtext.max_lost_steps
# Elastic, as the tutorial's Spot preset: 1 to 2 workers, each host a slice of its own; MaxText's fsdp axis fills in
# what a group's devices leave. The lost host's replacement comes only after the run (the keeper waits 900 s, as a
# preempted Spot VM's may never come), so Ray Train starts the next group on the one host left.
ELASTIC = (
    "cluster.num_slices=2 cluster.num_hosts=1 testing.host_replace_delay_s=900 train.min_workers=1 "
    "train.max_workers=2 maxtext.ici_fsdp_parallelism=-1"
)


def start(root, run_id, *sets):
    cmd = [*tpupipe_cmd(), "run", "--preset", "local-maxtext", "--run-id", run_id, "--output-root", str(root)]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _nonce(lines: list[str]) -> str:
    """The nonce every record line of a job's log carries (one job, one nonce)."""
    nonces = {m["nonce"] for m in map(protocol.RECORD.match, lines) if m}
    assert len(nonces) <= 1, nonces
    return nonces.pop() if nonces else ""


def records(run_dir):
    """The train job's records: the lines with its nonce."""
    lines = (run_dir / "logs" / "train.log").read_text().splitlines()
    return list(protocol.parse(lines, _nonce(lines)))


def checkpoint_steps(run_dir, run_id):
    root = run_dir / "train" / run_id / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / "_CHECKPOINT_METADATA").exists())


def test_local_maxtext_survives_a_lost_host_with_the_mesh_asked_for_and_evaluate_compares(tmp_path):
    """One run shows it all: the JAX slice check over both hosts, the mesh the spec asked for, an emulated host killed
    at the first periodic checkpoint and replaced, training resumed from that checkpoint, the loss down on the generated
    dataset, evaluate comparing before and after on its held-out split, nothing left."""
    run_id = unique_run_id("mt-lost-host")
    run_dir = tmp_path / run_id
    proc = start(tmp_path, run_id, f"maxtext.steps={LOST_HOST_STEPS}", ELASTIC)

    def first_checkpoint() -> bool:  # the first periodic checkpoint
        assert proc.poll() is None, proc.stdout.read()[-5000:]
        return any(s > 0 for s in checkpoint_steps(run_dir, run_id))

    try:
        wait_until(first_checkpoint, 900, "the first periodic checkpoint")
        ledger = json.loads((run_dir / "ledger.json").read_text())
        host = next(p for p in ledger["processes"] if p["role"] == "host-2")
        os.killpg(host["pgid"], signal.SIGKILL)  # the emulated host, with every process on it
        out, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-5000:]
    assert "host-2 (pid" in (run_dir / "logs" / "keeper.out").read_text()
    log = (run_dir / "logs" / "train.log").read_text()
    assert "jax runtime: 2 processes, 4 devices (2 per process, cpu)" in log
    assert "'num_workers': (1, 2)" in log and "ici_tensor_parallelism=2" in log
    assert "MaxText mesh: 4 devices: fsdp 2 x tensor 2" in log  # the first group: both hosts
    assert "MaxText mesh: 2 devices: tensor 2" in log  # the group on the host left: fsdp filled in as 1

    events = [p for k, p in records(run_dir) if k == "event" and p["event"] == "worker_group_started"]
    firsts = {e["group"]: e for e in reversed(events)}  # each group's first record
    groups = sorted(firsts, key=lambda g: firsts[g]["time"])
    assert len(groups) >= 2, "Ray Train did not restart the worker group"
    assert [firsts[g]["num_workers"] for g in groups] == [2, 1], "the next group did not shrink to 1 worker"
    restart = firsts[groups[1]]
    assert restart["restore_step"] is not None and restart["restore_step"] > 0
    steps = [(p["group"], p["step"]) for k, p in records(run_dir) if k == "metric"]
    before = max(step for group, step in steps if group == groups[0])
    after = min(step for group, step in steps if group == groups[1])
    assert after == restart["restore_step"] + 1
    assert before - restart["restore_step"] <= MAX_LOST_STEPS, "more than maxtext.max_lost_steps were repeated"

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "succeeded"
    # One record per step, but for the figures the lost host took with it: MaxText writes a step's figures after the
    # next step's (maxtext/common/metric_logger.py, buffer_and_write_metrics: "a queue of length 1"), and with
    # asynchronous checkpoints training runs on past the checkpoint it restores from, so the steps just before it whose
    # lines had not left the lost host (rank 0's logs, forwarded by that host's Ray) may never reach the run; every
    # step the new group ran is there, and nothing after the restored step is missing.
    kept = [row["step"] for row in summary["history"]]
    assert kept == sorted(set(kept)) and set(range(restart["restore_step"] + 1, LOST_HOST_STEPS)) <= set(kept)
    missing = set(range(LOST_HOST_STEPS)) - set(kept)
    assert all(step <= restart["restore_step"] for step in missing), missing
    assert len(missing) <= MAX_LOST_STEPS + 1, missing
    assert LOST_HOST_STEPS - 1 in checkpoint_steps(run_dir, run_id)
    assert summary["checkpoint"].endswith(f"/{LOST_HOST_STEPS - 1}")
    losses = summary["train_losses"]
    assert losses[-1] < 0.5 * losses[0]
    assert all(row["tflops_per_s_per_device"] >= 0 and row["tokens_per_s_per_device"] > 0 for row in summary["history"])
    assert summary["eval_loss_after"] < summary["eval_loss_before"]
    # The goodput ledger: the steps the first worker group ran after its checkpoint, and the restart, lost to
    # failures; MaxText's saves counted; one step record per step, the second group's from the restored step on.
    categories = assert_goodput_accounts(summary)
    assert categories["lost to failures"]["seconds"] > 0 and categories["checkpoint saves"]["seconds"] > 0
    # The programs compiled, timed apart from trainer start and kept under the output root for the next run
    assert categories["compilation"]["seconds"] > 0 and summary["goodput"]["compile_cache"]["compiles"] > 0
    # (compiled in the run's own directory, promoted by the train stage with their hashes in the trusted manifest)
    promoted = list((tmp_path / "cache" / "compile" / "tiny-llama").glob("cpu-1hosts-2-slice/*/*-cache"))
    assert promoted
    (manifest,) = (tmp_path / "_cache" / "compile" / "tiny-llama" / "cpu-1hosts-2-slice").glob("*.json")
    assert {p.name for p in promoted} <= set(json.loads(manifest.read_text())["entries"])
    assert any(round(loss, 3) != loss for loss in losses)  # MaxText's metrics file: not its 3-decimal log lines
    assert [s["step"] for s in summary["steps"]] == kept
    assert all(s["group"] >= 1 for s in summary["steps"] if s["step"] > restart["restore_step"])
    check = summary["slice_check"]  # a psum over the 4 devices of both hosts, and the sharded block's parity
    assert check["ok"] and check["backend"] == "jax" and check["device"] == "cpu"
    assert (check["num_ranks"], check["num_hosts"], check["num_devices"], check["ranks_verified"]) == (2, 2, 4, 2)
    assert check["all_reduce"] == check["expected_all_reduce"] == 10
    assert check["max_abs_diff"] < 1e-2 and check["seconds"] > 0
    assert check["devices_checked"] == 4  # each device's block alone, before any collective
    assert check["gbytes_per_s"] >= check["floor_gbytes_per_s"] == 0.02  # the timed 32 MiB psum, CPU's floor
    # The generated dataset through MaxText's hf pipeline: training read the train split's file, the evaluation the
    # held-out split's, and no held-out example is a training one; the gate promotes on the held-out figure.
    data = run_dir / "train" / "maxtext-data"
    train_ids, eval_ids = (maxtext_data.read_ids(str(data / f)) for f in ("train.jsonl", "heldout.jsonl"))
    assert len(train_ids) == 1024 and len(eval_ids) == 128 and not set(train_ids) & set(eval_ids)
    for job in ("train", "evaluate"):
        lines = (run_dir / "logs" / f"{job}.log").read_text().splitlines()
        argv = next(line for line in lines if "MaxText argv:" in line)
        assert f"hf_train_files={data / 'train.jsonl'} hf_eval_files={data / 'heldout.jsonl'}" in argv, argv
    assert "MaxText data: 1024 training examples" in log
    gate = summary["gate"]
    assert summary["eval_not_held_out"] is None and gate["held_out"] is True
    assert (gate["decision"], gate["promoted"]) == ("promote", True), gate["reason"]
    evaluation = json.loads((run_dir / "stages" / "evaluate.json").read_text())["result"]
    assert evaluation["eval_split"].startswith(f"the generated dataset's held-out split (128 examples, {data}/heldout")
    # MaxText's eval loop ran in the train job (trainers.maxtext_eval): the last group measured the trained model
    # after the last step, the figure the evaluate stage took; the evaluation job measured only the model as
    # initialised, on the same key (the same rows: a group of the last one's size).
    measured = [p for k, p in records(run_dir) if k == "event" and p["event"] == "eval"]
    assert [p["which"] for p in measured] == ["after"] and summary["eval_loss_after"] == measured[0]["eval_loss"]
    assert evaluation["measured_by"] == {"before": "this evaluation job", "after": "the train job"}
    assert evaluation["eval_key"] == measured[0]["eval_key"]
    assert "evaluate: measuring before in an evaluation job; known: after (the train job)" in out
    assert "held-out loss" in out and "not held out" not in out
    for needle in ("TFLOP/s/dev", "tok/s/dev", "held-out perplexity", "slice check", "slice bandwidth"):
        assert needle in out
    # MaxText's engine answered the first 64 held-out prompts in the train job (trainers.maxtext_generation): the
    # model training started from in the first group, before it trained, the trained one in the last group; the
    # summary prints each task metric before and after.
    answered = {p["which"]: p for k, p in records(run_dir) if k == "event" and p["event"] == "answers"}
    assert set(answered) == {"before", "after"} and {a["num_examples"] for a in answered.values()} == {64}
    # each model's answering its own event at its own time, its scoring the answers event's (the goodput ledger's)
    made = {p["which"]: p for k, p in records(run_dir) if k == "event" and p["event"] == "answered"}
    assert set(made) == {"before", "after"} and all(made[w]["time"] <= answered[w]["time"] for w in made)
    task = summary["task"]
    assert task["num_examples"] == 64 and task["against"] == "before training"
    rows = [json.loads(line) for line in (run_dir / "eval" / "answers.jsonl").read_text().splitlines()]
    assert len(rows) == 64 and any(r["answer"] != r["before training"] for r in rows)
    before, after = task["metrics_before"]["exact_match"], task["metrics_after"]["exact_match"]
    assert f"  exact_match          untrained {before:.3f}   trained {after:.3f}" in out, out
    print(f"MaxText answers: {len(rows)}; exact match before {before:.3f}, after {after:.3f}")
    assert run_processes(run_id) == []
