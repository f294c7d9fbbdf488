"""A preemption with notice during local FSDP training (``testing.drain_host_at_step``; MaxText's:
tests/e2e/test_local_maxtext.py): the keeper sends the last emulated host a SIGTERM once the workers have logged the
step, Ray's ``ray start`` drains its node (reason PREEMPTION, a deadline ``cluster.preemption_notice_s`` away), Ray
Train's watcher announces it, and the trainer saves at once, waits for the save to be committed and trains no
further; the host is killed at the deadline, the keeper replaces it, and the restarted worker group restores that
checkpoint: no step is trained twice, and the run succeeds. One drain, as short a run as lets the notice land during
training."""

import json

import pytest

from tests.helpers import job_records, tpupipe_run, unique_run_id

pytestmark = pytest.mark.e2e

DRAIN_STEP = 20
# No answers generated before and after training (eval.generate_examples=0): the test reads none.
SETS = (
    f"cluster.slice_check=false testing.drain_host_at_step={DRAIN_STEP} cluster.preemption_notice_s=20 "
    "epochs=6 batch_size=16 train.num_to_keep=10 gate.register=false eval.generate_examples=0"
)


def test_a_drain_with_notice_commits_a_just_in_time_checkpoint_and_the_resumed_run_repeats_no_step(tmp_path):
    run_id = unique_run_id("drain")
    proc = tpupipe_run(tmp_path, run_id, SETS)
    run_dir = tmp_path / run_id
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "succeeded"
    keeper = (run_dir / "logs" / "keeper.out").read_text()
    assert f"preempted at step {DRAIN_STEP} (testing.drain_host_at_step)" in keeper, keeper

    events = [p for kind, p in job_records((run_dir / "logs" / "train.log").read_text()) if kind == "event"]
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
