"""Which checkpoints a restart may restore: only those whose writer committed them, by the commit marker each
writer puts down last. Every other checkpoint directory is a save a lost worker group left half written: it is
ignored, reported (one line naming it) and pruned, so it never costs storage again nor hides a committed one.

- DCP (the FSDP trainer's sharded resume points, ``trainers.checkpoints``): the index ``.metadata``. Every rank
  writes its shards first; then the coordinator alone, in ``FileSystemWriter.finish``, pickles the index into
  ``.metadata.tmp`` and renames it to ``.metadata`` (torch 2.14.1, ``torch/distributed/checkpoint/filesystem.py``,
  https://github.com/pytorch/pytorch/blob/v2.14.1/torch/distributed/checkpoint/filesystem.py). Its presence is the
  commit; its absence (or a ``.metadata.tmp`` alone) is a save cut short.
- Orbax (MaxText's checkpoints, ``<output>/<run>/checkpoints/<step>``): on a local or mounted path (what the
  trainers see: a local directory, or on GKE the bucket's FUSE mount) Orbax writes a step into
  ``<step>.orbax-checkpoint-tmp`` and renames it to ``<step>`` once every item is written
  (``AtomicRenameTemporaryPath``); only on a ``gs://`` path does it write into ``<step>`` and put down
  ``commit_success.txt`` last (``CommitFileTemporaryPath``; the choice is ``get_default_temporary_path_class``)
  (orbax-checkpoint 0.12.8, ``orbax/checkpoint/_src/path/atomicity.py`` and ``atomicity_defaults.py``,
  https://github.com/google/orbax/tree/main/checkpoint/orbax/checkpoint/_src/path). MaxText restores by itself
  through its manager's newest step (maxtext 0.2.5, ``maxtext/common/checkpointing.py``: ``latest_step``, over the
  Orbax v1 ``training.Checkpointer`` that ``create_orbax_checkpoint_manager`` builds), which lists only finalized
  steps by the same rule; here the same rule names the step it will restore and prunes the temporary directories
  (MaxText does not set the Checkpointer's ``cleanup_tmp_directories``, False by default: orbax-checkpoint 0.12.8,
  ``orbax/checkpoint/experimental/v1/_src/training/checkpointer.py``).

  Why the rename and not the marker on GKE: the run writes MaxText's checkpoints to the bucket's FUSE mount
  (``base_output_directory`` is the run's directory there: ``components.workload.maxtext.train_args``, given
  ``Target.run_dir``), the path the trainers open as files (this module, the spec mark, MaxText's restore and the
  evaluate job), so Orbax commits by the rename. A rename is atomic there only in a bucket with
  hierarchical namespace (https://cloud.google.com/storage/docs/rename-hns-folders; Cloud Storage FUSE, which by
  default refuses a directory's rename in a flat bucket: ``--rename-dir-limit``, 0,
  https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options), so a MaxText run on GKE requires one:
  preflight refuses a flat ``gke.bucket`` and a bucket the run creates has it
  (``components.cloud.storage.without_hierarchical_namespace``). With that, a step under its final name is whole, and
  its name is the commit here as locally.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

DCP_INDEX = ".metadata"
ORBAX_TMP = ".orbax-checkpoint-tmp"  # orbax/checkpoint/_src/path/atomicity_types.py: TMP_DIR_SUFFIX


def dcp_committed(directory: Path) -> bool:
    """DCP's coordinator renamed the index into place: every rank's shards were written before it."""
    return (directory / DCP_INDEX).is_file()


def orbax_step(directory: Path) -> int | None:
    """The step of a committed Orbax checkpoint directory on a local or mounted path: renamed from its temporary
    name to ``<step>``; None for anything else."""
    return int(directory.name) if directory.name.isdigit() and directory.is_dir() else None


def sort_out(
    candidates: list[Path], committed: Callable[[Path], bool], prune: bool, say: Callable[[str], None] = print
) -> list[Path]:
    """The committed ones of ``candidates``; each other one reported in one line and, with ``prune``, removed. Prune
    only where no writer can still be writing: a worker group's start, the one before it gone."""
    kept = []
    for path in sorted(candidates):
        if committed(path):
            kept.append(path)
            continue
        say(
            f"ignored uncommitted checkpoint {path} (a save cut short: no commit marker)"
            + (", pruned" if prune else "")
        )
        if prune:
            shutil.rmtree(path, ignore_errors=True)
    return kept


def newest_orbax(root: Path, prune: bool, say: Callable[[str], None] = print) -> Path | None:
    """The newest committed Orbax step under ``root`` (MaxText's ``<output>/<run>/checkpoints``): the one MaxText
    restores."""
    if not root.is_dir():
        return None
    steps = [d for d in root.iterdir() if d.is_dir() and (d.name.isdigit() or ORBAX_TMP in d.name)]
    kept = sort_out(steps, lambda d: orbax_step(d) is not None, prune, say)
    return max(kept, key=lambda d: int(d.name), default=None)
