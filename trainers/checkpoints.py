"""The FSDP2 trainer's checkpoints (``trainers.fsdp``): sharded resume points while it trains, one full Hugging Face
checkpoint at the end.

Resume points are ``torch.distributed.checkpoint`` (DCP) checkpoints: each rank writes its own shards of the weights
and the optimizer state (one ``__<rank>_0.distcp`` file a rank, and rank 0 the ``.metadata`` index), asynchronously:
the state is copied to host memory while training waits, then written by a background thread while it goes on
(``async_save``, https://docs.pytorch.org/docs/stable/distributed.checkpoint.html). A restore has each rank read
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
import os
import pickle
import tempfile
import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec, protocol

CHECKPOINT_META = "tpupipe_checkpoint.json"
DCP_INDEX = ".metadata"  # DCP's index of a sharded checkpoint (torch/distributed/checkpoint/filesystem.py)
SHARDED_PREFIX = "checkpoint_step"  # a sharded checkpoint's directory: this and its global step, 8 digits

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


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds more than tensors, plain containers and DCP's metadata: a pickle that would run code
    on load."""


# ---------------------------------------------------------------- sharded resume points (DCP)


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # The frozen per-layer table never changes (in E2B ~4.7 GB of bf16): a restore keeps the base model's, so the
    # model's load is not strict about it (DCP's load itself fails on any key the checkpoint lacks).
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def sharded_state(model, optimizer) -> dict[str, Any]:
    """This rank's shards of the weights (and of the optimizer state when ``optimizer`` is given): DTensors of the
    FSDP2 model, which DCP saves and loads shard by shard."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model, options=_options())}
    weights, optim = get_state_dict(model, optimizer, options=_options())
    return {"model": weights, "optim": optim}


class AsyncSaver:
    """Sharded checkpoints written while training goes on, one in flight at a time. DCP's background writer runs
    collectives (the plan's exchange, the index's commit) on a gloo group of its own, away from the training's group,
    as DCP asks of an asynchronous save (``async_save``: "A CPU backend must be enabled"; the asynchronous
    checkpointing recipe, https://docs.pytorch.org/tutorials/recipes/distributed_async_checkpoint_recipe.html)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        self.pending: Any = None  # the save in flight: DCP's future

    def wait(self) -> float:
        """Wait for the save in flight, if any; the seconds waited."""
        started = time.perf_counter()
        if self.pending is not None:
            self.pending.result()
            self.pending = None
        return time.perf_counter() - started

    def save(self, model, optimizer, meta: dict[str, Any], rank: int, directory: Path) -> float:
        """Start writing this rank's shards into ``directory`` (rank 0 also the index and ``meta``); the seconds
        training waited (the previous save, if still in flight, and the copy of the state to host memory)."""
        import torch.distributed.checkpoint as dcp

        started = time.perf_counter()
        self.wait()
        directory.mkdir(parents=True, exist_ok=True)
        if rank == 0:  # a step saved again (after a restart): not complete again until DCP commits its new index
            (directory / DCP_INDEX).unlink(missing_ok=True)
            (directory / CHECKPOINT_META).write_text(json.dumps({**meta, "optimizer": optimizer is not None}))
        state = sharded_state(model, optimizer)
        self.pending = dcp.async_save(state, checkpoint_id=str(directory), process_group=self.group)
        return time.perf_counter() - started


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _INDEX_CLASSES.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"GLOBAL {module}.{name} is not part of a checkpoint's index")


def _read_index(path: Path):
    """DCP's index at ``path`` through :class:`_IndexUnpickler`: its metadata classes and nothing else."""
    with open(path, "rb") as f:
        try:
            return _IndexUnpickler(f).load()
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpoint(f"refusing to load {path}: {e}") from None


def _safe_reader(directory: Path):
    """DCP's file reader, its index read with :func:`_read_index` instead of ``pickle.load``."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_data(self, plan, planner):
            """DCP's own reads, one file a thread: a rank reads its items file by file, one after the other
            (``FileSystemReader.read_data``), and a rank of a group smaller than the one that saved (an elastic
            restart after a lost host) holds shards of several writers' files."""
            from torch.futures import Future

            read_files_in_parallel(super().read_data, plan, planner, self.storage_data)
            finished: Future = Future()
            finished.set_result(None)
            return finished

        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            metadata = _read_index(directory / (DCP_INDEX if rank is None else f"__{rank}{DCP_INDEX}"))
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(directory))


READ_THREADS = 8  # most files of a checkpoint one rank reads at once


def read_files_in_parallel(read, plan, planner, storage_data: dict) -> None:
    """``read`` (a DCP reader's ``read_data``) over ``plan``'s items (a ``LoadPlan``) split by the file each item
    is in, the files on up to :data:`READ_THREADS` threads at once; every item is read into its own tensor of the
    state (the planner's ``resolve_tensor``), so the files' reads share nothing. Waits for all; a file's error is
    raised as itself."""
    import dataclasses
    from concurrent.futures import ThreadPoolExecutor

    by_file: dict[str, list] = {}
    for item in plan.items:
        by_file.setdefault(storage_data[item.storage_index].relative_path, []).append(item)
    if len(by_file) > 1:
        with ThreadPoolExecutor(min(READ_THREADS, len(by_file)), thread_name_prefix="dcp-read") as pool:
            reads = [pool.submit(read, dataclasses.replace(plan, items=items), planner) for items in by_file.values()]
            for done in reads:
                done.result().wait()  # the thread's error, then DCP's future (torch.futures.Future)
    else:
        read(plan, planner).wait()


def _safe_planner():
    """DCP's default load planner, its non-tensor items read with ``weights_only=True`` (the default unpickles them
    with ``weights_only=False``: torch/distributed/checkpoint/default_planner.py, ``load_bytes``)."""
    import torch
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class SafePlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
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
    """A complete sharded checkpoint: DCP commits its index (renamed into place) once every rank's shards are
    written (``FileSystemWriter.finish``, torch/distributed/checkpoint/filesystem.py)."""
    return (directory / DCP_INDEX).is_file() and (directory / CHECKPOINT_META).is_file()


def newest_sharded(storage: Path) -> Path | None:
    """The newest complete sharded checkpoint in the run's storage (the directories ``Checkpointer`` names by
    step), whether or not Ray Train had registered it when the worker group was lost: Ray Train's controller
    collects the workers' reports only every few seconds (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default,
    ray/train/v2/_internal/constants.py), and a host lost in between would otherwise cost a whole period more."""
    done = [d for d in storage.glob(f"{SHARDED_PREFIX}*") if is_sharded(d)]
    return max(done, key=lambda d: d.name, default=None)


def load_sharded(model, optimizer, directory: Path) -> dict[str, Any]:
    """Restore a checkpoint of :class:`AsyncSaver` into the sharded model and, when it holds one, the optimizer
    (without one the optimizer starts fresh); each rank reads only its own shards. Returns the checkpoint's meta."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    meta = json.loads((directory / CHECKPOINT_META).read_text())
    with_optimizer = optimizer is not None and meta.get("optimizer", False)
    state = sharded_state(model, optimizer if with_optimizer else None)
    _read_index(directory / DCP_INDEX)  # refused here, with its own error, rather than inside DCP's load
    try:
        dcp.load(state, storage_reader=_safe_reader(directory), planner=_safe_planner())
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


def save_final(model, tokenizer, meta: dict[str, Any], rank: int, directory: Path) -> None:
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
    (directory / CHECKPOINT_META).write_text(json.dumps(meta))


# ---------------------------------------------------------------- through Ray Train (the trainer's workers)

PREEMPTION_POLL_STEPS = 10  # steps between asks whether a preemption is announced (a barrier over the workers)


class Position:
    """Where training is: the epoch, the batches of it done, the global step."""

    def __init__(self, epoch: int = 0, epoch_step: int = 0, global_step: int = 0) -> None:
        self.epoch, self.epoch_step, self.global_step = epoch, epoch_step, global_step


class Checkpointer:
    """The worker's checkpoints through Ray Train. A sharded one (``checkpoints.AsyncSaver``) is written by every
    rank straight into the run's storage, in a directory all ranks name alike, and reported by every rank with Ray
    Train's asynchronous upload whose upload function waits for the rank's own write: Ray Train registers a checkpoint
    once every rank reporting it has uploaded, and merges the ranks' files into one directory ("Checkpoints from
    multiple workers will be merged into one directory in persistent storage", ``ray.train.report``; the
    ``checkpoint_upload_fn`` and ``CheckpointUploadMode.ASYNC`` of Ray 2.60's ``ray/train/v2/api/train_fn_utils.py``
    and https://docs.ray.io/en/latest/train/user-guides/checkpoints.html). So a restarted group never sees a
    checkpoint whose shards are not all written, and training waits only for the copy of its state to host memory.
    Rank 0 emits a ``checkpoint`` event per save with the seconds training waited (the goodput ledger's "checkpoint
    saves") and a ``checkpoint_written`` event when its shards are written, with the save's whole duration."""

    def __init__(self, spec: RunSpec, model, optimizer, tokenizer, rank: int, world: int) -> None:
        self.t, self.model, self.tokenizer, self.rank, self.world = spec.train, model, tokenizer, rank, world
        self.optimizer = optimizer if spec.train.checkpoint_optimizer else None
        self.saver = AsyncSaver()
        # Nothing announces a preemption where Ray Train's watcher is off (the local platform turns it off: nothing
        # drains its hosts; RAY_TRAIN_ENABLE_PREEMPTION_WATCHER, ray/train/v2/_internal/constants.py): no poll there.
        self.watched = os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1").lower() not in ("0", "false")
        self.preempted = False

    def _meta(self, at: Position) -> dict[str, Any]:
        return {
            "epoch": at.epoch,
            "epoch_step": at.epoch_step,
            "global_step": at.global_step,
            "world": self.world,
            "base_model": self.t.model_id,
        }

    def sharded(self, at: Position, metrics: dict[str, Any]) -> None:
        import ray.train
        from ray.train import CheckpointUploadMode

        name = f"{SHARDED_PREFIX}{at.global_step:08d}"
        # The run's storage: a local path (locally the output root; on GKE the bucket's FUSE mount), DeveloperAPI.
        directory = Path(ray.train.get_context().get_storage().experiment_fs_path) / name
        started = time.perf_counter()
        blocked = self.saver.save(self.model, self.optimizer, self._meta(at), self.rank, directory)
        written, step = self.saver.pending, at.global_step

        def persisted(checkpoint, _dir_name: str):
            written.result()
            if self.rank == 0:
                whole = {"seconds": time.perf_counter() - started, "time": time.time()}
                protocol.emit("event", {"event": "checkpoint_written", "step": step, **whole})
            return checkpoint

        reporting = time.perf_counter()
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(str(directory)),
            checkpoint_dir_name=name,
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
            delete_local_checkpoint_after_upload=False,
            checkpoint_upload_fn=persisted,
        )
        reported = time.perf_counter() - reporting
        self._waited(at.global_step, blocked + reported, {"staging_s": blocked, "report_s": reported})

    def final(self, at: Position, metrics: dict[str, Any]) -> None:
        """The trained model, once, gathered to rank 0 (``checkpoints.save_final``), after the last sharded save is
        written: what the registry and the evaluate stage read, the run's last checkpoint."""
        import ray.train

        started = time.perf_counter()
        self.saver.wait()
        with tempfile.TemporaryDirectory() as tmp:
            meta = {**self._meta(at), "final": True, "loss": metrics.get("loss")}
            save_final(self.model, self.tokenizer, meta, self.rank, Path(tmp))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if self.rank == 0 else None)
        self._waited(at.global_step, time.perf_counter() - started)

    def _waited(self, step: int, seconds: float, parts: dict[str, float] | None = None) -> None:
        """Rank 0's ``checkpoint`` event: the seconds training waited (and, for a sharded save, the copy to host
        memory and Ray Train's report apart)."""
        if self.rank == 0:
            event = {"event": "checkpoint", "step": step, "seconds": seconds, "time": time.time(), **(parts or {})}
            protocol.emit("event", event)

    def after_step(self, at: Position, last_of_epoch: bool) -> None:
        """A sharded save every ``train.checkpoint_every_steps`` steps (the epoch's last is saved at its end), and at
        once when Ray Train announces a preemption of one of the workers' nodes (``ray.train.get_preemption_info``:
        Ray's node drain with its deadline, Ray 2.60 ``ray/train/v2/api/train_fn_utils.py``), asked every
        :data:`PREEMPTION_POLL_STEPS` steps because every rank must ask together. On GKE a Spot VM's preemption
        notice gives the pods 15 s of a 30 s graceful termination (SIGTERM to each container's main process, here
        ``ray start``; https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms, "Termination and graceful
        shutdown of Spot VMs"); the training workers are not those processes, and no public source says Ray turns
        that SIGTERM into the node drain the preemption notice comes from. Where it does not, a preempted run loses
        at most ``train.checkpoint_every_steps`` steps (the newest checkpoint), which is what that field bounds."""
        import ray.train

        if last_of_epoch:
            return
        every = self.t.checkpoint_every_steps
        if every and at.global_step % every == 0:
            self.sharded(at, {"global_step": at.global_step, "epoch": at.epoch + 1})
        elif self.watched and not self.preempted and at.global_step % PREEMPTION_POLL_STEPS == 0:
            info = ray.train.get_preemption_info()
            if info is not None:
                self.preempted = True
                if self.rank == 0:
                    print(f"preemption announced (ranks {info.preempted_ranks}): saving at step {at.global_step}")
                self.sharded(at, {"global_step": at.global_step, "epoch": at.epoch + 1, "preempted": True})
