"""MaxText through JaxTrainer on the local platform, elastic as the tutorial's Spot preset (2 emulated hosts, each a
slice of its own, 1 to 2 workers of 2 CPU devices each, one JAX runtime), in the two faults a Spot slice meets: two
runs of the same model, slice and image under one output root, so the second is the first's recurring run.

1. **A lost host** (a preempted Spot VM whose replacement does not come in time): a host killed at the first
   periodic checkpoint, which the elastic run survives on fewer workers; its compile job fills the compile cache.
2. **A preemption with notice** during training (``testing.drain_host_at_step``: the keeper sends the last host a
   SIGTERM once the workers logged the step, Ray's ``ray start`` drains its node, a deadline
   ``cluster.preemption_notice_s`` away): MaxText saves at the step JAX agrees and the restarted group restores it.
   The recurring run of the same configuration runs no compile job and loads the first's programs through the
   compile cache's trusted path, and what the first run's training job wrote in its own cache directory (a program
   planted over one it loaded, and one under a new name) reaches neither the cache kept across runs nor this run
   (``components.stages.compile_cache``)."""

import json
import os
import signal
import subprocess

import pytest

from components.platforms.local.processes import run_processes
from components.spec import protocol
from components.workload import cache, maxtext
from tests.helpers import (
    assert_goodput_accounts,
    job_records,
    tpupipe_cmd,
    tpupipe_run,
    unique_run_id,
    wait_until,
)
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
# The drained run: the notice at step 12, two periodic checkpoints' worth of steps before the end; no slice check and
# no answers (the first run's show them), nothing registered.
DRAIN_STEP = 12
DRAIN = (
    f"cluster.slice_check=false testing.drain_host_at_step={DRAIN_STEP} cluster.preemption_notice_s=20 "
    f"maxtext.steps={LOST_HOST_STEPS} eval.generate_examples=0 gate.register=false"
)
PLANTED = b"\x7fELF a program the training job planted" * 4


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


def first_group_compiles(run_dir) -> list[bool]:
    """Whether each program the run's first worker group compiled was found in the compile cache (its ``compiled``
    events, rank 0's, in order): what the first group loaded, before any group of the run wrote a program."""
    events = [p for kind, p in job_records((run_dir / "logs" / "train.log").read_text()) if kind == "event"]
    starts = sorted({e["time"] for e in events if e["event"] == "worker_group_started"})
    until = starts[1] if len(starts) > 1 else float("inf")
    return [e["hit"] for e in events if e["event"] == "compiled" and starts[0] <= e["time"] < until]


def train_result(run_dir) -> dict:
    return json.loads((run_dir / "stages" / "train.json").read_text())["result"]


def lose_a_host(root, run_id) -> str:
    """The first run: host-2 killed with every process on it at the first periodic checkpoint; its output."""
    run_dir = root / run_id
    proc = start(root, run_id, f"maxtext.steps={LOST_HOST_STEPS}", ELASTIC)

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
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two runs in order under one root; between them, the first training job's own cache directory planted."""
    root = tmp_path_factory.mktemp("maxtext")
    lost, drained = unique_run_id("mt-lost-host"), unique_run_id("mt-drain")
    out = lose_a_host(root, lost)
    first = train_result(root / lost)
    own = root / lost / "cache" / first["compile_cache"]["staged"]["key"]  # its jax_cache_dir: its pods may write
    planted = sorted(p for p in own.rglob("*") if p.is_file())
    for entry in planted:
        entry.write_bytes(PLANTED)
    (own / "jit_planted-cache").write_bytes(PLANTED)
    proc = tpupipe_run(root, drained, ELASTIC, DRAIN, preset="local-maxtext")
    return {"root": root, "lost": (lost, out, first, planted), "drained": (drained, proc)}


def test_local_maxtext_survives_a_lost_host_with_the_mesh_asked_for_and_evaluate_compares(runs):
    """One run shows it all: the JAX slice check over both hosts, the mesh the spec asked for, an emulated host killed
    at the first periodic checkpoint and replaced, training resumed from that checkpoint, the loss down on the generated
    dataset, evaluate comparing before and after on its held-out split, nothing left."""
    tmp_path = runs["root"]
    run_id, out, _, _ = runs["lost"]
    run_dir = tmp_path / run_id
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


def test_a_recurring_run_loads_the_compile_jobs_programs_and_never_what_a_training_job_planted(runs):
    root = runs["root"]
    lost, _, one, planted = runs["lost"]
    drained, proc = runs["drained"]
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    made = one["compile_cache"]
    assert made["compile_job"]["compiles"] > 0 and made["recorded"]["recorded"] > 0
    assert one["timeline"]["compile_cache"]["hits"] > 0
    # The first run's training job already loads what its compile job compiled: the first program its first group
    # (the whole size the compile job compiled for) needs, before anything of the group's own was written
    assert first_group_compiles(root / lost)[0] is True
    assert planted  # what it wrote in its own directory, each overwritten, and one more beside them

    two = train_result(root / drained)
    staged = two["compile_cache"]["staged"]
    assert staged["key"] == made["staged"]["key"]  # the same model, slice and image
    assert two["compile_cache"]["compile_job"] is None  # the configuration is recorded: no compile job
    assert staged["staged"] == made["recorded"]["recorded"] and staged["refused"] == [] and staged["unlisted"] == 0
    # The recurring run loads the staged programs: its first group's first program too, when the run's cache held only
    # those (the run's hit count alone would not show it: the first run's also counts the answering engine's programs,
    # which its first group compiled and its last loaded)
    assert first_group_compiles(root / drained)[0] is True and two["timeline"]["compile_cache"]["hits"] > 0
    shared = root / cache.CACHE_PREFIX / staged["key"]
    for where in (shared, root / drained / "cache" / staged["key"]):
        assert not (where / "jit_planted-cache").exists()
        assert all(p.read_bytes() != PLANTED for p in where.rglob("*") if p.is_file())
    assert "WARNING: compile cache" not in (root / drained / "logs" / "pipeline.log").read_text()


def test_a_drain_with_notice_during_maxtext_saves_at_the_step_jax_agrees_and_the_resumed_run_repeats_no_step(runs):
    """Ray Train marks the workers preempted, the trainer hands the notice to JAX (a SIGTERM to each worker process,
    which JAX's preemption sync manager takes), MaxText saves at the step JAX agrees across the processes (its
    ``enable_autocheckpoint``) and stops; the group Ray Train starts on the host left restores that checkpoint and
    trains on from the step after it."""
    run_id, proc = runs["drained"]
    run_dir = runs["root"] / run_id
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"
    keeper = (run_dir / "logs" / "keeper.out").read_text()
    assert f"preempted at step {DRAIN_STEP} (testing.drain_host_at_step)" in keeper, keeper

    log = (run_dir / "logs" / "train.log").read_text()
    found = job_records(log)
    events = [p for kind, p in found if kind == "event"]
    saves = [e for e in events if e["event"] == "preemption_checkpoint"]
    assert len(saves) == 1, saves
    saved = saves[0]["step"]
    assert saved >= DRAIN_STEP and saves[0]["before_deadline_s"] > 0  # committed within the notice
    # MaxText's own save on the notice, not a periodic one: JAX took the SIGTERM, Orbax reached the agreed step
    assert "SIGTERM caught" in log and f"Reached preemption sync point, step={saved}" in log
    # Committed: Orbax's marker in MaxText's checkpoint of that step (trainers.committed), unless the resumed group's
    # later saves made it one too old to keep (maxtext.CHECKPOINTS_KEPT; a save at 19 is followed by the periodic 20
    # and the last, 29); the restore below shows it was whole either way
    kept = sorted(int(d.name) for d in (run_dir / "train" / run_id / "checkpoints").iterdir() if d.name.isdigit())
    if saved in kept:
        assert (run_dir / "train" / run_id / "checkpoints" / str(saved) / "_CHECKPOINT_METADATA").is_file()
    else:
        assert len([step for step in kept if step > saved]) >= maxtext.CHECKPOINTS_KEPT, (saved, kept)
    groups = [e for e in events if e["event"] == "worker_group_started"]
    firsts = {e["group"]: e for e in reversed(groups)}
    order = sorted(firsts, key=lambda g: firsts[g]["time"])
    assert len(order) == 2, groups  # the first group, and the one Ray Train restarted after the preemption
    assert [firsts[g]["num_workers"] for g in order] == [2, 1]  # on the host left: its replacement comes late
    assert firsts[order[1]]["restore_step"] == saved  # the restarted group restored the just-in-time checkpoint
    steps = [(p["group"], p["step"]) for kind, p in found if kind == "metric" and "step" in p]
    # Nothing trained after the save; MaxText logs a step's figures after the next step's (a queue of length 1:
    # maxtext/common/metric_logger.py, buffer_and_write_metrics), so the saved step's own line may stay unwritten
    lost, resumed = ([step for group, step in steps if group == g] for g in order)
    assert lost and resumed, (saved, steps)  # the notice came during training: steps before it and after it
    assert saved - 1 <= max(lost) <= saved
    assert min(resumed) == saved + 1  # 0 steps repeated
    assert run_processes(run_id) == []
