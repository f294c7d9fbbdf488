"""The FSDP2 trainer's checkpoints (``trainers.fsdp``): sharded resume points while it trains, one full Hugging Face
checkpoint at the end.

Resume points are ``torch.distributed.checkpoint`` (DCP) checkpoints: each rank writes its own shards of the weights
and the optimizer state (one ``__<rank>_0.distcp`` file a rank, and rank 0 the ``.metadata`` index), asynchronously:
the state is copied to host memory (into buffers kept for the run; on the CPU while the next step computes), then
written by a background thread while training goes on (``AsyncSaver``; ``async_save``,
https://docs.pytorch.org/docs/stable/distributed.checkpoint.html). Their saves and reports through Ray Train are
``trainers.ray_checkpoints``'. A restore has each rank read
only the byte ranges of the shards it now holds, which also reshards a checkpoint written by another number of ranks
(DCP's load plans the reads from the saved chunks and the new sharding, the "resharding" of
https://docs.pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html).

The trained model (``save_final``): the state gathered to rank 0 and written as safetensors with the config and the
tokenizer, what the registry and the evaluate stage read. The frozen per-layer table is left out of both.

Loading runs no code planted in a checkpoint's directory: DCP's index is a pickle, read here through an unpickler
that admits DCP's own metadata classes and nothing else, and its non-tensor items (the optimizer's hyperparameters)
are read with ``torch.load(weights_only=True)``
(https://docs.pytorch.org/docs/stable/notes/serialization.html#weights-only-security); the final checkpoint is
safetensors and JSON. Imports torch and safetensors only inside the functions.
"""

from __future__ import annotations

import json
import pickle
import shutil
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from trainers import committed

if TYPE_CHECKING:
    from components.spec import RunSpec

CHECKPOINT_META = "tpupipe_checkpoint.json"
DCP_INDEX = committed.DCP_INDEX  # DCP's index of a sharded checkpoint, its commit marker
SHARDED_PREFIX = "checkpoint_step"  # a sharded checkpoint's directory: this and its global step, 8 digits
FINAL_PREFIX = "final_"  # the trained model's directory in the run's storage: this and its global step, 8 digits
# Ray Train's record of the checkpoints it registered, in the run's storage (Ray 2.60:
# CHECKPOINT_MANAGER_SNAPSHOT_FILENAME, ray/train/v2/_internal/constants.py; written by its CheckpointManager at every
# registration, before it deletes the ones past ``num_to_keep``: ray/train/v2/_internal/execution/checkpoint/
# checkpoint_manager.py, ``_write_state_to_storage``; https://github.com/ray-project/ray/tree/ray-2.60.0/python/ray/
# train/v2/_internal).
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"

# What DCP's index holds (torch/distributed/checkpoint/metadata.py and filesystem.py's _StorageInfo), by module.
_INDEX_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "StorageMeta",
        "MetadataIndex",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch": {"Size", "bfloat16", "bool", "complex64", "complex128"}
    | {f"{kind}{bits}" for kind in ("float", "int", "uint") for bits in (8, 16, 32, 64)},
    "torch.serialization": {"_get_layout"},  # a layout by its name (TensorProperties pickles it so)
    "pathlib": {"PosixPath", "PurePosixPath"},  # StorageMeta.checkpoint_id
    "collections": {"OrderedDict"},
}


class CheckpointMeta(TypedDict):
    """What a sharded checkpoint records of itself (:data:`CHECKPOINT_META`, written by rank 0 with its shards:
    ``trainers.ray_checkpoints.Checkpointer``): where training was, the worker group's size, the base model, and the
    training spec's digest (:func:`training_digest`)."""

    epoch: int
    epoch_step: int  # the batches of the epoch done, on a group of ``world`` ranks
    global_step: int
    world: int
    base_model: str
    spec_digest: str
    optimizer: NotRequired[bool]  # whether it holds the optimizer's state (AsyncSaver.save adds it)


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds more than tensors, plain containers and DCP's metadata: a pickle that would run code
    on load."""


# ---------------------------------------------------------------- sharded resume points (DCP)


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # The frozen per-layer table never changes (in E2B ~4.7 GB of bf16): a restore keeps the base model's, so the
    # model's load is not strict about it (DCP's load itself fails on any key the checkpoint lacks).
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def sharded_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """This rank's shards of the weights (and of the optimizer state when ``optimizer`` is given): DTensors of the
    FSDP2 model, which DCP saves and loads shard by shard."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model, options=_options())}
    weights, optim = get_state_dict(model, optimizer, options=_options())
    return {"model": weights, "optim": optim}


class AsyncSaver:
    """Sharded checkpoints written while training goes on, one in flight at a time. DCP's background writer runs
    collectives on a gloo group of its own, away from the training's group, as ``async_save`` asks ("A CPU backend
    must be enabled"; https://docs.pytorch.org/tutorials/recipes/distributed_async_checkpoint_recipe.html). The copy
    of the state to host memory goes into buffers allocated at the first save and refilled by the later ones (one
    ``DefaultStager`` for the run: its ``StateDictStager`` keeps a host copy per storage staged, ``torch/distributed/
    checkpoint/_state_dict_stager.py``; without one ``async_save`` allocates anew each save). With
    ``background_staging`` (the weights on the CPU) the copy runs in the stager's thread while the next step's
    forward and backward run (they do not change the state), and the optimizer's step waits for it (:meth:`guard`),
    the pattern of ``AsyncSaveResponse.staging_completion`` (https://docs.pytorch.org/docs/stable/distributed.
    checkpoint.html); on an accelerator the copy is made before the save returns, as by default (the stager's
    background copy is documented for CUDA streams only). With ``asynchronous=False`` (``train.checkpoint_staging``:
    the fallback, and what ``auto`` picks on an accelerator, where DCP's asynchronous staging has never run) each save
    is written by ``dcp.save`` before it returns, on the same gloo group: training waits for the whole write."""

    def __init__(self, background_staging: bool = False, asynchronous: bool = True) -> None:
        import torch.distributed as dist
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.asynchronous = asynchronous
        # StagingOptions(use_pinned_memory, use_shared_memory, use_async_staging, use_non_blocking_copy)
        staging = StagingOptions(False, False, background_staging and asynchronous, False)
        self.stager = DefaultStager(staging) if asynchronous else None
        self.pending: Any = None  # the save in flight: DCP's future of the write
        self.staging: Any = None  # its copy to host memory, while it runs in the stager's thread

    def guard(self, optimizer: Any, waited: Callable[[float], None] | None = None) -> None:
        """Have each step of ``optimizer`` first wait for the copy in flight (:meth:`staged`); ``waited`` is called with
        the seconds a step waited."""

        def before_step(*_: Any) -> None:
            seconds = self.staged()
            if seconds is not None and waited is not None:
                waited(seconds)

        optimizer.register_step_pre_hook(before_step)

    def staged(self) -> float | None:
        """Wait for the copy to host memory in flight: the seconds waited, None when there was none."""
        if self.staging is None:
            return None
        started = time.perf_counter()
        self.staging.result()
        self.staging = None
        return time.perf_counter() - started

    def wait(self) -> float:
        """Wait for the save in flight, if any; the seconds waited."""
        started = time.perf_counter()
        if self.pending is not None:
            self.pending.result()
            self.pending = None
            self.staging = None
        return time.perf_counter() - started

    def save(self, model: Any, optimizer: Any, meta: CheckpointMeta, rank: int, directory: Path) -> dict[str, float]:
        """Start writing this rank's shards into ``directory`` (rank 0 also the index and ``meta``); the seconds
        training waited, by part: ``previous_s`` (the previous save, if still in flight), ``state_s`` (this rank's
        shards gathered into a state dict) and ``staging_s`` (the copy to host memory, or only its start where it
        runs in the background), or, written synchronously, ``write_s`` (the whole write)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        previous = self.wait()
        directory.mkdir(parents=True, exist_ok=True)
        if rank == 0:  # a step saved again (after a restart): not complete again until DCP commits its new index
            (directory / DCP_INDEX).unlink(missing_ok=True)
            (directory / CHECKPOINT_META).write_text(json.dumps({**meta, "optimizer": optimizer is not None}))
        gathered = time.perf_counter()
        state = sharded_state(model, optimizer)
        staging = time.perf_counter()
        if not self.asynchronous:  # written before training goes on; nothing left in flight
            from concurrent.futures import Future

            dcp.save(state, checkpoint_id=str(directory), process_group=self.group)
            self.pending = Future()
            self.pending.set_result(None)
            return {"previous_s": previous, "state_s": staging - gathered, "write_s": time.perf_counter() - staging}
        response = dcp.async_save(
            state, checkpoint_id=str(directory), process_group=self.group, async_stager=self.stager
        )
        if isinstance(response, AsyncSaveResponse):  # the copy runs in the stager's thread
            self.pending, self.staging = response.upload_completion, response.staging_completion
        else:
            self.pending = response
        return {"previous_s": previous, "state_s": staging - gathered, "staging_s": time.perf_counter() - staging}

    def close(self) -> None:
        """Wait for the save in flight and free the host copies (the stager's buffers)."""
        self.wait()
        if self.stager is not None:
            self.stager.close()


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _INDEX_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not part of a checkpoint's index")


def _read_index(path: Path) -> Any:
    """DCP's index at ``path`` through :class:`_IndexUnpickler`: its metadata classes and nothing else."""
    with open(path, "rb") as f:
        try:
            return _IndexUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpoint(f"refusing to load {path}: {e}") from None


def _safe_reader(directory: Path) -> Any:
    """DCP's file reader, its index read with :func:`_read_index` instead of ``pickle.load``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):  # type: ignore[misc]  # a torch class: Any here (no type information)
        def read_data(self, plan: Any, planner: Any) -> Any:
            """DCP's own reads, one file a thread: a rank reads its items file by file, one after the other
            (``FileSystemReader.read_data``), and a rank of a group smaller than the one that saved (an elastic
            restart after a lost host) holds shards of several writers' files."""
            from torch.futures import Future

            read_files_in_parallel(super().read_data, plan, planner, self.storage_data)
            finished: Future = Future()
            finished.set_result(None)
            return finished

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            rank = kwargs.get("rank")
            metadata = _read_index(directory / (DCP_INDEX if rank is None else f"__{rank}{DCP_INDEX}"))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(directory))


READ_THREADS = 8  # most files of a checkpoint one rank reads at once


def read_files_in_parallel(
    read: Callable[[Any, Any], Any], plan: Any, planner: Any, storage_data: dict[Any, Any]
) -> None:
    """``read`` (a DCP reader's ``read_data``) over ``plan``'s items (a ``LoadPlan``) split by the file each item
    is in, the files on up to :data:`READ_THREADS` threads at once; every item is read into its own tensor of the
    state (the planner's ``resolve_tensor``), so the files' reads share nothing. Waits for all; a file's error is
    raised as itself."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    by_file: dict[str, list[Any]] = {}
    for item in plan.items:
        by_file.setdefault(storage_data[item.storage_index].relative_path, []).append(item)
    if len(by_file) > 1:
        with ThreadPoolExecutor(min(READ_THREADS, len(by_file)), thread_name_prefix="dcp-read") as pool:
            reads = [pool.submit(read, dataclasses.replace(plan, items=items), planner) for items in by_file.values()]
            for done in reads:
                done.result().wait()  # the thread's error, then DCP's future (torch.futures.Future)
    else:
        read(plan, planner).wait()


def _safe_planner() -> Any:
    """DCP's default load planner, its non-tensor items read with ``weights_only=True`` (the default unpickles them
    with ``weights_only=False``: torch/distributed/checkpoint/default_planner.py, ``load_bytes``)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):  # type: ignore[misc]  # a torch class: Any here (no type information)
        def load_bytes(self, read_item: Any, value: BytesIO) -> None:
            try:
                torch.load(value, weights_only=True, map_location="cpu")
            except pickle.UnpicklingError as e:
                lines = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "Unsupported" in line]
                raise UnsafeCheckpoint(
                    f"refusing to load {read_item.dest_index.fqn}: not tensors and plain containers; torch.load "
                    f"with weights_only=True said: {lines[0] if lines else str(e).strip()[:300]}"
                ) from None
            value.seek(0)  # checked: the default's own read of the same bytes unpickles nothing else
            super().load_bytes(read_item, value)

    return SafePlanner()


def is_sharded(directory: Path) -> bool:
    """A committed sharded checkpoint: DCP's coordinator renames its index into place once every rank's shards are
    written (``trainers.committed``), and rank 0 wrote the trainer's meta before the save began."""
    return committed.dcp_committed(directory) and (directory / CHECKPOINT_META).is_file()


def newest_sharded(storage: Path, prune: bool = False, say: Callable[[str], None] | None = None) -> Path | None:
    """The newest committed sharded checkpoint in the run's storage (the directories ``Checkpointer`` names by
    step), whether or not Ray Train had registered it when the worker group was lost: Ray Train's controller
    collects the workers' reports only every few seconds (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default,
    ray/train/v2/_internal/constants.py), and a host lost in between would otherwise cost a whole period more. Any
    other checkpoint directory there is a save cut short (never reported: a rank reports only once its write is
    done): ignored and, with ``prune`` (rank 0 at a worker group's start), reported and removed."""
    found = [d for d in storage.glob(f"{SHARDED_PREFIX}*") if d.is_dir()]
    kept = committed.sort_out(found, is_sharded, prune, say or (print if prune else _quiet))
    return max(kept, key=lambda d: d.name, default=None)


def registered(storage: Path) -> set[str] | None:
    """The checkpoint directories (their names) Ray Train has registered in the run's storage: those it keeps
    (``checkpoint_results``), its latest, and those reported and not yet processed (``pending_training_results``), as
    its snapshot (:data:`RAY_SNAPSHOT`) lists them; none when it has written no snapshot (it registered none). None
    when the snapshot cannot be read (being written, or of another form): then which ones it holds is unknown."""
    path = storage / RAY_SNAPSHOT
    if not path.is_file():
        return set()
    try:
        state = json.loads(path.read_text())
        results = [*state["checkpoint_results"], *state["pending_training_results"]]
        results.append(state.get("latest_checkpoint_result") or {})
        return {r["checkpoint_dir_name"] for r in results if r.get("checkpoint_dir_name")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def restore_point(storage: Path, prune: bool = False, say: Callable[[str], None] = print) -> Path | None:
    """Where a worker group resumes: the newest committed sharded checkpoint (:func:`newest_sharded`). With ``prune``
    (rank 0 at a worker group's start, the group before it gone, before any other rank looks: the choice is then
    handed to the others, ``trainers.ray_checkpoints.restore_point``), the run's storage keeps only what a restore may
    need: the checkpoint chosen and every one Ray Train registered (its latest, which a restart without a sharded
    checkpoint restores, and the others it keeps and deletes itself past ``train.num_to_keep``: a registered
    directory gone would break its records, which it checks at a restart of the run). Gone, each reported in one line:
    every save cut short (:func:`newest_sharded`), every other committed sharded checkpoint Ray Train never
    registered (written, then the group was lost before its report reached Ray Train: older than the chosen one, never
    restored again), and every trained model's directory (``final_<step>``) it never registered (a group lost while
    writing or reporting it: the group that finishes writes its own), each older than the newest checkpoint Ray
    Train's record lists (a newer one may be registered in a record fresher than the one read). Where Ray Train's
    record cannot be read (:func:`registered`), or lists none, none of the committed ones is removed."""
    chosen = newest_sharded(storage, prune, say if prune else _quiet)
    if not prune:
        return chosen
    known = registered(storage)
    if known is None:
        say(f"Ray Train's record of its checkpoints ({storage / RAY_SNAPSHOT}) cannot be read: no committed one pruned")
        return chosen
    # Only what is older than the newest checkpoint the record lists: the record is read through this pod's mount,
    # whose metadata cache may serve a copy older than the controller's last write (Cloud Storage FUSE caches an
    # object's metadata, 60 s by default: https://cloud.google.com/storage/docs/cloud-storage-fuse/caching), and
    # Ray Train registers reports in their order, so a directory older than a listed one that the record does not
    # list was never registered (or was let go past train.num_to_keep), while a newer one may be in a fresher record.
    newest = max((_step(name) for name in known), default=-1)
    candidates = [d for d in storage.glob(f"{SHARDED_PREFIX}*") if d.is_dir() and d != chosen]
    candidates += [d for d in storage.glob(f"{FINAL_PREFIX}*") if d.is_dir()]
    stale = [d for d in candidates if d.name not in known and -1 < _step(d.name) < newest]
    for directory in sorted(stale):
        what = "trained model" if directory.name.startswith(FINAL_PREFIX) else "checkpoint"
        say(f"pruned {what} {directory}: never registered by Ray Train, and not the one restored")
        shutil.rmtree(directory, ignore_errors=True)
    return chosen


def _step(name: str) -> int:
    """The global step a checkpoint directory's name ends with (its last 8 characters); -1 when it does not."""
    tail = name[-8:]
    return int(tail) if tail.isdigit() else -1


def _quiet(_line: str) -> None:
    """Ranks other than 0 skip the same checkpoints without saying so: one line a checkpoint."""


class ForeignCheckpoint(RuntimeError):
    """A resume point written under another training spec than the run's own: never resumed."""


# The ``maxtext.*`` settings a MaxText resume point is a point of, besides ``train.*``: what decides the shape or the
# meaning of its model and optimizer state. The model config (the parameters' shapes); the data and the global batch
# and sequence length (what a step is, what its data iterator's position means); the step count (MaxText's learning
# rate schedule spans ``learning_rate_schedule_steps``, which defaults to ``steps``: configs/base.yml at maxtext
# 0.2.5) and the peak learning rate (the optimizer's schedule). Left out: the parallelism axes and the emulated
# device count (how the state is sharded, not what it holds: Orbax restores a checkpoint into the shardings the
# restoring mesh asks for, https://orbax.readthedocs.io/en/latest/guides/checkpoint/checkpointing_pytrees.html, as a
# FSDP resume across worker counts), the rematerialisation policy (recomputes the same values to save memory), the
# checkpoint cadence (max_lost_steps, checkpoint_period) and the evaluate stage's eval_steps.
MAXTEXT_STATE_FIELDS = (
    "model_name",
    "dataset_type",
    "per_device_batch_size",
    "max_target_length",
    "steps",
    "learning_rate",
)


def training_digest(spec: RunSpec) -> str:
    """The digest of what a resume point is a point of: the run spec's ``train`` section (the model, data, steps,
    optimizer), the prompt format the examples are written in (``trainers.data.PROMPT``) and, for the FSDP workload,
    which tokens its loss is over (``trainers.data.LABELS``), or for the MaxText workload its ``maxtext`` settings of
    :data:`MAXTEXT_STATE_FIELDS`: canonical JSON's sha256. The trainers' code is not in the local platform's image
    hash (components/platforms/local/envs.py hashes ``images/``), so a resubmitted run on an updated checkout would
    otherwise resume under another format or loss. Recorded in every sharded checkpoint's meta (``spec_digest``) and
    beside MaxText's checkpoints."""
    import dataclasses
    import hashlib

    from trainers import data

    what: dict[str, Any] = {"train": dataclasses.asdict(spec.train), "prompt": data.PROMPT}
    if spec.train.workload == "maxtext":  # an FSDP run reads no maxtext setting: changing one never refuses it
        what["maxtext"] = {f: getattr(spec.maxtext, f) for f in MAXTEXT_STATE_FIELDS}
    else:  # MaxText trains on the whole text, packed (trainers.maxtext_data)
        what["labels"] = data.LABELS
    text = json.dumps(what, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def resumable_meta(directory: Path, digest: str = "") -> CheckpointMeta:
    """The meta of the sharded checkpoint in ``directory``; :class:`ForeignCheckpoint` when ``digest`` is given and
    the checkpoint recorded another one, or none."""
    meta: CheckpointMeta = json.loads((directory / CHECKPOINT_META).read_text())
    if digest and meta.get("spec_digest") != digest:
        raise _foreign(directory, meta.get("spec_digest"), digest)
    return meta


def _foreign(directory: Path, recorded: str | None, digest: str) -> ForeignCheckpoint:
    return ForeignCheckpoint(
        f"not resumed: checkpoint {directory} was written under another training spec (spec digest "
        f"{recorded or 'none recorded'}, this run's {digest}); a run resumes only its own checkpoints: start it "
        "under a new run id"
    )


SPEC_MARK = "tpupipe_spec.json"  # beside the checkpoints of a trainer that resumes by itself (MaxText)


def mark_checkpoints(directory: Path, digest: str) -> None:
    """For a trainer that resumes by itself from ``directory/checkpoints`` (MaxText: its ``<output>/<run name>/``):
    the training spec's digest recorded beside them before the first is written; :class:`ForeignCheckpoint` when
    checkpoints are there under another digest, or under none."""
    mark = directory / SPEC_MARK
    recorded = json.loads(mark.read_text()).get("spec_digest") if mark.is_file() else None
    saved = directory / "checkpoints"
    if recorded is None and not (saved.is_dir() and any(saved.iterdir())):
        directory.mkdir(parents=True, exist_ok=True)
        mark.write_text(json.dumps({"spec_digest": digest}))
        return
    if recorded != digest:
        raise _foreign(saved, recorded, digest)


def load_sharded(model: Any, optimizer: Any, directory: Path, digest: str = "", group: Any = None) -> CheckpointMeta:
    """Restore a checkpoint of :class:`AsyncSaver` into the sharded model and, when it holds one, the optimizer
    (without one the optimizer starts fresh); each rank reads only its own shards. Returns the checkpoint's meta.
    With ``digest`` (:func:`training_digest` of the run's spec), a checkpoint recorded under another one, or under
    none, is refused before anything is read: :class:`ForeignCheckpoint` (the train job fails saying so; a run
    resumes only its own points, and a run id, which names the checkpoints' directory, is used once). ``group``: the
    process group DCP's load runs its own collectives on (its plans and metadata, gathered and scattered as Python
    objects: ``process_group`` of ``torch.distributed.checkpoint.load``, torch 2.14.1's
    torch/distributed/checkpoint/state_dict_loader.py), the gloo group :class:`AsyncSaver` writes with, not the
    accelerator's (TorchTPU's process group carries tensors); None: the default group."""
    if not is_sharded(directory):
        raise UncommittedCheckpoint(
            f"not resumed: {directory} holds no committed DCP index ({DCP_INDEX}): a save cut short"
        )
    meta = resumable_meta(directory, digest)
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    with_optimizer = optimizer is not None and meta.get("optimizer", False)
    state = sharded_state(model, optimizer if with_optimizer else None)
    _read_index(directory / DCP_INDEX)  # refused here, with its own error, rather than inside DCP's load
    try:
        dcp.load(state, storage_reader=_safe_reader(directory), planner=_safe_planner(), process_group=group)
    except dcp.api.CheckpointException as e:  # DCP wraps each rank's failure: a refusal is raised as itself
        for failure, _trace in e.failures.values():
            if isinstance(failure, UnsafeCheckpoint):
                raise failure from None
        raise
    set_state_dict(
        model,
        optimizer if with_optimizer else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
        options=_options(),
    )
    return meta


# ---------------------------------------------------------------- the trained model (Hugging Face layout)


def save_final(model: Any, tokenizer: Any, meta: dict[str, Any], rank: int, directory: Path) -> None:
    """Gather the trained weights to rank 0 and write them with the config and tokenizer (every rank calls it). The
    frozen per-layer table is left out (``ignore_frozen_params``): the model is the base model (``train.model_id``)
    with these weights loaded over it (``trainers.model.load_trained``)."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    if rank != 0:
        return
    if model.config.get_text_config().tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"), metadata={"format": "pt"}
    )
    model.config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # The meta last, renamed into place: its presence is the commit (final_committed), as DCP's index is a sharded one's
    (directory / f"{CHECKPOINT_META}.tmp").write_text(json.dumps(meta))
    (directory / f"{CHECKPOINT_META}.tmp").replace(directory / CHECKPOINT_META)


class UncommittedCheckpoint(RuntimeError):
    """A checkpoint without its commit marker: a save cut short, never loaded."""


def final_committed(directory: Path) -> None:
    """:class:`UncommittedCheckpoint` unless ``directory`` is a trained model :func:`save_final` finished: its meta,
    written last, is there. (Through Ray Train the final is registered only once its upload is done, so a registered
    one always has it; this refuses a directory copied or uploaded only in part.)"""
    if not (directory / CHECKPOINT_META).is_file():
        raise UncommittedCheckpoint(
            f"not loaded: {directory} holds no {CHECKPOINT_META}, which the trained model's save writes last: the save "
            "or its copy was cut short"
        )


# ---------------------------------------------------------------- where training is


class Position:
    """Where training is: the epoch, the batches of it done, the global step."""

    def __init__(self, epoch: int = 0, epoch_step: int = 0, global_step: int = 0) -> None:
        self.epoch, self.epoch_step, self.global_step = epoch, epoch_step, global_step
