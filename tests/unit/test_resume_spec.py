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
