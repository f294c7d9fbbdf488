"""Only committed checkpoints are restored (``trainers.committed``): each restore path finds its checkpoint by the
commit marker its writer puts down last, and every other checkpoint directory (a save cut short) is ignored,
reported in one line naming it, and pruned at a worker group's start.

The directories here are laid out as the writers leave them when killed part way (DCP: the shards, maybe
``.metadata.tmp``, no ``.metadata``; Orbax: ``<step>.orbax-checkpoint-tmp``); a real kill during a real save is
``tests/e2e/test_kill_during_save.py``."""

from __future__ import annotations

import json

import pytest

from trainers import checkpoints
from trainers.maxtext_train import latest_checkpoint


def _sharded(storage, step: int, *, index: bool, tmp_index: bool = False):
    directory = storage / f"{checkpoints.SHARDED_PREFIX}{step:08d}"
    directory.mkdir(parents=True)
    (directory / checkpoints.CHECKPOINT_META).write_text(json.dumps({"global_step": step}))
    for rank in (0, 1):
        (directory / f"__{rank}_0.distcp").write_bytes(b"shard")
    if index:
        (directory / checkpoints.DCP_INDEX).write_bytes(b"index")
    if tmp_index:
        (directory / f"{checkpoints.DCP_INDEX}.tmp").write_bytes(b"ind")
    return directory


def test_the_newest_committed_sharded_checkpoint_is_restored_and_saves_cut_short_are_reported_then_pruned(
    tmp_path, capsys
):
    storage = tmp_path / "run"
    older = _sharded(storage, 10, index=True)
    cut_short = [_sharded(storage, 20, index=False), _sharded(storage, 30, index=False, tmp_index=True)]
    # A rank other than 0 skips them in silence and leaves them: rank 0 alone reports and prunes.
    assert checkpoints.newest_sharded(storage) == older
    assert capsys.readouterr().out == "" and all(d.is_dir() for d in cut_short)
    assert checkpoints.newest_sharded(storage, prune=True) == older
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"ignored uncommitted checkpoint {d} (a save cut short: no commit marker), pruned" for d in cut_short
    ]
    assert not any(d.exists() for d in cut_short) and older.is_dir()
    assert checkpoints.newest_sharded(storage, prune=True) == older and capsys.readouterr().out == ""  # once


def test_a_sharded_checkpoint_without_its_index_is_refused_by_the_load_itself(tmp_path):
    directory = _sharded(tmp_path, 20, index=False, tmp_index=True)
    with pytest.raises(checkpoints.UncommittedCheckpoint, match=r"no committed DCP index \(\.metadata\)"):
        checkpoints.load_sharded(None, None, directory)


def test_a_trained_model_whose_meta_is_missing_is_refused(tmp_path):
    # trainers.model.load_trained asks this first (in the torch environment: tests/e2e/test_kill_during_save.py)
    (tmp_path / "model.safetensors").write_bytes(b"partial")
    with pytest.raises(checkpoints.UncommittedCheckpoint, match="writes last"):
        checkpoints.final_committed(tmp_path)
    (tmp_path / checkpoints.CHECKPOINT_META).write_text("{}")
    checkpoints.final_committed(tmp_path)  # committed: no error


def test_maxtext_restores_the_newest_renamed_orbax_step_and_its_temporary_directories_are_pruned(tmp_path, capsys):
    root = tmp_path / "out" / "run" / "checkpoints"
    for name in ("2", "4", "6.orbax-checkpoint-tmp", "8.orbax-checkpoint-tmp-1733400000"):
        (root / name / "model_params").mkdir(parents=True)
    (root / "10").write_text("a file, not a step")  # not a checkpoint at all: neither restored nor pruned
    assert latest_checkpoint(tmp_path / "out", "run") == root / "4"
    assert capsys.readouterr().out.count("ignored uncommitted checkpoint") == 2
    assert all((root / name).is_dir() for name in ("6.orbax-checkpoint-tmp", "8.orbax-checkpoint-tmp-1733400000"))
    assert latest_checkpoint(tmp_path / "out", "run", prune=True) == root / "4"
    assert sorted(p.name for p in root.iterdir()) == ["10", "2", "4"]
    assert latest_checkpoint(tmp_path / "out", "missing") is None
