"""A preemption with notice during local FSDP training, and during local MaxText training (the last test)
(``testing.drain_host_at_step``): the keeper sends the last emulated host a SIGTERM once the workers have logged the
step, Ray's ``ray start`` drains its node (reason PREEMPTION, a deadline ``cluster.preemption_notice_s`` away), Ray
Train's watcher announces it, and the trainer saves at once, waits for the save to be committed and trains no
further; the host is killed at the deadline, the keeper replaces it, and the restarted worker group restores that
checkpoint: no step is trained twice, and the run succeeds. One drain, as short a run as lets the notice land during
training."""

import json
import subprocess

import pytest

from components.spec import protocol
from components.workload import maxtext
from tests.helpers import tpupipe_run, unique_run_id

pytestmark = pytest.mark.e2e

DRAIN_STEP = 20
# No answers generated before and after training (eval.generate_examples=0): the test reads none.
SETS = (
    f"cluster.slice_check=false testing.drain_host_at_step={DRAIN_STEP} cluster.preemption_notice_s=20 "
    "epochs=6 batch_size=16 train.num_to_keep=10 gate.register=false eval.generate_examples=0"
)


def _records(text: str) -> list[tuple[str, dict]]:
    """The trainer's records in the stage's log, each once (Ray may forward a worker's line twice; each record
    carries its time)."""
    out, seen = [], set()
    for line in text.splitlines():
        m = protocol.RECORD.match(line)
        if m is None:
            continue
        for kind, payload in protocol.parse([line], m["nonce"]):
            key = json.dumps([kind, payload], sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append((kind, payload))
    return out


def test_a_drain_with_notice_commits_a_just_in_time_checkpoint_and_the_resumed_run_repeats_no_step(tmp_path):
    run_id = unique_run_id("drain")
    proc = tpupipe_run(tmp_path, run_id, SETS)
    run_dir = tmp_path / run_id
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"
    keeper = (run_dir / "logs" / "keeper.out").read_text()
    assert f"preempted at step {DRAIN_STEP} (testing.drain_host_at_step)" in keeper, keeper

    events = [p for kind, p in _records((run_dir / "logs" / "train.log").read_text()) if kind == "event"]
    saves = [e for e in events if e["event"] == "preemption_checkpoint"]
    assert len(saves) == 1, saves
    saved = saves[0]["step"]
    assert saved >= DRAIN_STEP  # the notice comes at the drain step; the save at the next poll after Ray announces it
    starts = sorted(e["time"] for e in events if e["event"] == "worker_group_started")
    assert len(starts) == 2, starts  # the first group, and the one Ray Train restarted after the preemption
    # Committed: Ray Train registered it (the save's report returned before the event) and its DCP index is written.
    assert (run_dir / "train" / "ray_results" / run_id / f"checkpoint_step{saved:08d}" / ".metadata").is_file()
    restored = [e for e in events if e["event"] == "restored"]
    assert [e["step"] for e in restored] == [saved]  # the restarted group restored the just-in-time checkpoint
    steps = [e for e in events if e["event"] == "step"]
    lost_group = [e["step"] for e in steps if e["time"] < starts[1]]
    new_group = [e["step"] for e in steps if e["time"] > starts[1]]
    assert max(lost_group) == saved  # nothing trained after the save
    assert min(new_group) == saved + 1  # and the new group starts right after it: 0 steps repeated


# MaxText: the notice at step 12, two periodic checkpoints' worth of steps before the end (maxtext.max_lost_steps 10).
MAXTEXT_DRAIN_STEP, MAXTEXT_STEPS = 12, 30
MAXTEXT_SETS = (
    f"cluster.slice_check=false testing.drain_host_at_step={MAXTEXT_DRAIN_STEP} cluster.preemption_notice_s=20 "
    f"maxtext.steps={MAXTEXT_STEPS} eval.generate_examples=0 gate.register=false"
)


def test_a_drain_with_notice_during_maxtext_saves_at_the_step_jax_agrees_and_the_resumed_run_repeats_no_step(tmp_path):
    """The same notice during local MaxText training: Ray Train marks the workers preempted, the trainer hands the
    notice to JAX (a SIGTERM to each worker process, which JAX's preemption sync manager takes), MaxText saves at the
    step JAX agrees across the processes (its ``enable_autocheckpoint``) and stops; the restarted group restores that
    checkpoint and trains on from the step after it."""
    from tests.helpers import tpupipe_cmd

    run_id = unique_run_id("mt-drain")
    cmd = [*tpupipe_cmd(), "run", "--preset", "local-maxtext", "--run-id", run_id, "--output-root", str(tmp_path)]
    proc = subprocess.run([*cmd, "--set", MAXTEXT_SETS], capture_output=True, text=True, timeout=1500)
    run_dir = tmp_path / run_id
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"
    keeper = (run_dir / "logs" / "keeper.out").read_text()
    assert f"preempted at step {MAXTEXT_DRAIN_STEP} (testing.drain_host_at_step)" in keeper, keeper

    log = (run_dir / "logs" / "train.log").read_text()
    records = _records(log)
    events = [p for kind, p in records if kind == "event"]
    saves = [e for e in events if e["event"] == "preemption_checkpoint"]
    assert len(saves) == 1, saves
    saved = saves[0]["step"]
    assert saved >= MAXTEXT_DRAIN_STEP and saves[0]["before_deadline_s"] > 0  # committed within the notice
    # MaxText's own save on the notice, not a periodic one: JAX took the SIGTERM, Orbax reached the agreed step
    assert "SIGTERM caught" in log and f"Reached preemption sync point, step={saved}" in log
    # Committed: Orbax's marker in MaxText's checkpoint of that step (trainers.committed), unless the resumed group's
    # later saves made it one too old to keep (maxtext.CHECKPOINTS_KEPT; a save at 19 is followed by the periodic 20
    # and the last, 29); the restore below shows it was whole either way
    kept = sorted(int(d.name) for d in (run_dir / "train" / run_id / "checkpoints").iterdir() if d.name.isdigit())
    newer = [step for step in kept if step > saved]
    if saved in kept:
        assert (run_dir / "train" / run_id / "checkpoints" / str(saved) / "_CHECKPOINT_METADATA").is_file()
    else:
        assert len(newer) >= maxtext.CHECKPOINTS_KEPT, (saved, kept)
    groups = [e for e in events if e["event"] == "worker_group_started"]
    firsts = {e["group"]: e for e in reversed(groups)}
    order = sorted(firsts, key=lambda g: firsts[g]["time"])
    assert len(order) == 2, groups  # the first group, and the one Ray Train restarted after the preemption
    assert firsts[order[1]]["restore_step"] == saved  # the restarted group restored the just-in-time checkpoint
    steps = [(p["group"], p["step"]) for kind, p in records if kind == "metric" and "step" in p]
    # Nothing trained after the save; MaxText logs a step's figures after the next step's (a queue of length 1:
    # maxtext/common/metric_logger.py, buffer_and_write_metrics), so the saved step's own line may stay unwritten
    lost, resumed = ([step for group, step in steps if group == g] for g in order)
    assert lost and resumed, (saved, steps)  # the notice came during training: steps before it and after it
    assert saved - 1 <= max(lost) <= saved
    assert min(resumed) == saved + 1  # 0 steps repeated
