"""A run never resumes a checkpoint written under another training spec (``trainers.checkpoints``): every sharded
checkpoint records the digest of the spec's ``train`` section it was written under, and a restart compares it with
its own before it reads anything; a mismatch, or a checkpoint that records none, is refused with a message naming
both digests (the train job fails; a run id is used once, so a new run starts fresh under its own id)."""

from __future__ import annotations

import json

import pytest

from components.workload import resolve
from trainers.checkpoints import CHECKPOINT_META, ForeignCheckpoint, resumable_meta, training_digest


def test_a_checkpoint_of_another_training_spec_is_refused_and_the_runs_own_is_resumed(tmp_path):
    own, other = resolve("local-fsdp", ""), resolve("local-fsdp", "train.learning_rate=0.5")
    assert training_digest(own) == training_digest(resolve("local-fsdp", ""))  # the same spec, the same digest
    assert training_digest(own) != training_digest(other)
    assert training_digest(own) == training_digest(resolve("local-fsdp", "gate.min_improvement=0.1"))  # not train
    meta = {"epoch": 0, "epoch_step": 3, "global_step": 3, "world": 2, "spec_digest": training_digest(own)}
    (tmp_path / CHECKPOINT_META).write_text(json.dumps(meta))
    assert resumable_meta(tmp_path, training_digest(own)) == meta
    with pytest.raises(ForeignCheckpoint, match="written under another training spec") as refused:
        resumable_meta(tmp_path, training_digest(other))
    assert training_digest(own) in str(refused.value) and training_digest(other) in str(refused.value)
    (tmp_path / CHECKPOINT_META).write_text(json.dumps({k: v for k, v in meta.items() if k != "spec_digest"}))
    with pytest.raises(ForeignCheckpoint, match="none recorded"):
        resumable_meta(tmp_path, training_digest(own))


def test_maxtext_checkpoints_are_marked_with_their_spec_and_another_specs_are_refused(tmp_path):
    """MaxText resumes by itself from ``<output>/<run name>/checkpoints``: the driver records the training spec's
    digest there before the first checkpoint, and refuses checkpoints marked with another, or with none."""
    from trainers.checkpoints import SPEC_MARK, mark_checkpoints

    own = training_digest(resolve("local-maxtext", ""))
    other = training_digest(resolve("local-maxtext", "train.seed=7"))
    run = tmp_path / "run"
    mark_checkpoints(run, own)  # a first start: marked
    assert json.loads((run / SPEC_MARK).read_text()) == {"spec_digest": own}
    (run / "checkpoints" / "10" / "items").mkdir(parents=True)
    mark_checkpoints(run, own)  # a restart of the same spec resumes
    with pytest.raises(ForeignCheckpoint, match=f"spec digest {own}, this run's {other}"):
        mark_checkpoints(run, other)
    (run / SPEC_MARK).unlink()
    with pytest.raises(ForeignCheckpoint, match="none recorded"):  # checkpoints of nobody's spec
        mark_checkpoints(run, own)


@pytest.mark.parametrize(
    "override",
    [
        "maxtext.model_name=llama3-8b",  # the parameters' shapes
        "maxtext.per_device_batch_size=3",  # what a step is
        "maxtext.max_target_length=64",
        "maxtext.steps=13",  # the learning rate schedule's length
        "maxtext.learning_rate=0.001",
        "maxtext.dataset_type=synthetic eval.generate_examples=0",
    ],
)
def test_a_maxtext_resume_under_a_changed_state_setting_is_refused(tmp_path, override):
    """A MaxText checkpoint is a point of its ``maxtext`` settings that decide the model's and optimizer's state too:
    one changed, the restart is refused as a changed ``train`` setting is."""
    from trainers.checkpoints import mark_checkpoints

    own, changed = resolve("local-maxtext", ""), resolve("local-maxtext", override)
    assert changed.maxtext != own.maxtext and changed.train == own.train  # only the maxtext setting differs
    run = tmp_path / "run"
    mark_checkpoints(run, training_digest(own))
    (run / "checkpoints" / "10" / "items").mkdir(parents=True)
    with pytest.raises(ForeignCheckpoint, match=f"spec digest {training_digest(own)}, this run's"):
        mark_checkpoints(run, training_digest(changed))


@pytest.mark.parametrize(
    "override",
    [
        "maxtext.ici_fsdp_parallelism=1 maxtext.ici_data_parallelism=-1",  # how the state is sharded
        "maxtext.remat_policy=full",  # recomputation, the same values
        "maxtext.max_lost_steps=5",  # the checkpoint cadence
        "maxtext.eval_steps=2",  # the evaluate stage's
    ],
)
def test_a_maxtext_resume_under_a_changed_sharding_or_cadence_setting_goes_on(tmp_path, override):
    """The settings that change how the state is laid out or how often it is saved, not what it holds, leave the
    digest as it was: the restart resumes. An FSDP run's digest ignores the maxtext section altogether."""
    from trainers.checkpoints import mark_checkpoints

    own, changed = resolve("local-maxtext", ""), resolve("local-maxtext", override)
    assert changed.maxtext != own.maxtext
    run = tmp_path / "run"
    mark_checkpoints(run, training_digest(own))
    (run / "checkpoints" / "10" / "items").mkdir(parents=True)
    mark_checkpoints(run, training_digest(changed))  # resumed
    fsdp = resolve("local-fsdp", "")
    assert training_digest(fsdp) == training_digest(resolve("local-fsdp", "maxtext.model_name=other"))
