"""Kill during a save, then resume (``tests/e2e/kill_during_save.py``, in the torch trainer environment, no Ray): the
FSDP trainer's ranks are SIGKILLed at seeded random points of a sharded save's write (before any item, part way
through a rank's items, after them, or with every shard and the index's temporary file written but not renamed),
then a group of 1, 2 or 3 ranks resumes. Every resume restores the newest checkpoint whose DCP index was in place
before it (never the one the kill cut short), reports and prunes the cut-short one, repeats no more steps than the
killed save's period plus the steps run while it was written, and ends at the loss of a run never killed."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytestmark = pytest.mark.trainer_env  # both run in a trainer environment, no Ray

# Seed 57's trials: kills in the saves of steps 3 and 6, part way through rank 1's items, before and after their
# middle, resumed on 1, 2 and 3 ranks (its fourth trial only repeated its first's point: step 3, part way, 1 rank).
TRIALS, SEED = 3, 57


def test_a_kill_during_a_save_is_never_restored_and_the_resume_repeats_at_most_a_period_and_its_write(tmp_path):
    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("torch").python
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "HOME": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    script = REPO / "tests" / "e2e" / "kill_during_save.py"
    proc = subprocess.run(
        [python, str(script), str(tmp_path), str(TRIALS), str(SEED)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    period = facts["period"]
    assert "writes last" in facts["final_refused"]  # the trained model's load refuses a save without its meta
    points = set()
    reported = [line for line in proc.stdout.splitlines() if line.startswith("ignored uncommitted checkpoint ")]
    for index, trial in enumerate(facts["trials"]):
        kill, before = trial["kill"], trial["committed_before_resume"]
        killed_save = f"checkpoint_step{kill['step']:08d}"
        assert trial["killed"], trial
        assert before[killed_save] is False, trial  # the kill did cut that save short: its index never went in
        committed = [name for name, done in before.items() if done]
        assert trial["restored"] == max(committed, default=None), trial  # the newest committed, never another
        restored_step = int(trial["restored"][-8:]) if trial["restored"] else 0
        assert restored_step == kill["step"] - period, trial  # the save before the killed one had committed
        # What the resume ran again: the killed save's period, and the steps trained while it was being written.
        assert period <= trial["steps_repeated"] <= 2 * period, trial
        for name, done in before.items():  # each cut-short save reported in one line by rank 0, then pruned
            lines = [line for line in reported if f"/trial{index}/{name} " in line]
            assert lines == ([] if done else [lines[0]]) and (done or lines[0].endswith(", pruned")), (name, reported)
        assert all(trial["left_after_resume"].values()), trial  # the resumed run wrote it again, whole
        assert trial["final_loss"] == pytest.approx(trial["reference_loss"], abs=1e-4), trial
        points.add((kill["rank"], kill["fraction"] > 0.5))
    assert len({t["resume_world"] for t in facts["trials"]}) > 1  # resumed onto other worker counts too
    assert len(points) > 1  # kills at different points of the write


# Seed 18's trials: a kill after the first item's write began in the save of step 3 (the restart restores step 0),
# and one after the second's began in the save of step 6 (it restores step 3); a third trial of seed 57's added no
# point of its own (after the second item, in the save of step 3).
MAXTEXT_TRIALS, MAXTEXT_SEED = 2, 18


def test_maxtext_killed_during_an_orbax_save_restores_only_a_renamed_step(tmp_path):
    """MaxText SIGKILLed at seeded points of an Orbax save (``tests/e2e/maxtext_kill_during_save.py``): the restart
    restores the newest step that had its final name before it (never the cut-short ``<step>.orbax-checkpoint-tmp``),
    which the trainer's rank-0 pick names and reports and prunes; the resumed run finishes."""
    from components.platforms.local import envs
    from tests.helpers import REPO

    python = envs.ensure_env("maxtext").python
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    script = REPO / "tests" / "e2e" / "maxtext_kill_during_save.py"
    proc = subprocess.run(
        [python, str(script), str(tmp_path), str(MAXTEXT_TRIALS), str(MAXTEXT_SEED)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("FACTS "))[6:])
    for trial in facts["trials"]:
        kill, before = trial["kill"], trial["committed_before_resume"]
        assert trial["killed"], trial
        assert before.get(str(kill["step"])) is not True, trial  # the kill cut that save short: never renamed
        committed = [int(name) for name, done in before.items() if done]
        assert trial["picked"] == str(max(committed)), trial  # the newest renamed step (step 0 is saved first)
        assert trial["restored_step"] == max(committed), trial  # MaxText's own restore agrees
        assert trial["first_step_after_resume"] == max(committed) + 1, trial
        # Run again: the killed save's period and the steps trained while it was written (Orbax saves asynchronously)
        assert trial["last_step_before_kill"] - max(committed) <= 2 * facts["period"], trial
        cut_short = [name for name, done in before.items() if not done]
        assert len(trial["reported"]) == len(cut_short) and all(r.endswith(", pruned") for r in trial["reported"])
        assert trial["resumed_rc"] == 0, trial.get("resumed_tail")
        assert all(trial["left_after_resume"].values()), trial  # no temporary directory left
