"""The FSDP2 trainer's checkpoints through Ray Train (``trainers.fsdp``'s workers): its sharded resume points written
while training goes on (``trainers.checkpoints.AsyncSaver``) and reported to Ray Train off the training's path, a save
at once when a preemption is announced, and the trained model at the end (``trainers.checkpoints.save_final``).
Imports torch and Ray only inside the functions."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec, protocol
from trainers import checkpoints
from trainers.checkpoints import FINAL_PREFIX, SHARDED_PREFIX, AsyncSaver, Position, save_final, training_digest

PREEMPTION_POLL_STEPS = 10  # steps between asks whether a preemption is announced (a barrier over the workers)


def restore_point(storage: Path, rank: int) -> Path | None:
    """The sharded checkpoint every rank of a new worker group restores: rank 0 alone looks at the run's storage,
    chooses and prunes (``trainers.checkpoints.restore_point``), and hands the others its choice (Ray Train's
    ``ray.train.collective.broadcast_from_rank_zero``, a barrier of the group: https://docs.ray.io/en/latest/train/
    api/doc/ray.train.collective.broadcast_from_rank_zero.html). Ranks that looked by themselves could each see
    another newest checkpoint (one committed, or pruned, between their looks) and restore different steps."""
    from ray.train.collective import broadcast_from_rank_zero

    chosen = checkpoints.restore_point(storage, prune=True) if rank == 0 else None
    name = broadcast_from_rank_zero(chosen.name if chosen is not None else "")
    return storage / name if name else None


def asynchronous(spec: RunSpec, on_cpu: bool) -> bool:
    """Whether sharded checkpoints are written in the background (``train.checkpoint_staging``): ``async``, or
    ``auto`` with the weights on the CPU (the path that has run); ``sync``, or ``auto`` on an accelerator, writes
    each before training goes on."""
    staging = spec.train.checkpoint_staging
    return staging == "async" or (staging == "auto" and on_cpu)


class Checkpointer:
    """The worker's checkpoints through Ray Train. A sharded one (:class:`AsyncSaver`) is written by every rank
    straight into the run's storage, in a directory all ranks name alike, and reported by every rank, once its own
    shards are written, from a thread of the checkpointer's: Ray Train's report passes a barrier of every rank (its
    synchronization actor agrees on the directory: ``_sync_checkpoint_dir_name_across_ranks``, Ray 2.60's
    ``ray/train/v2/_internal/execution/context.py``) that training would otherwise wait for at each save. The files
    are in the run's storage already (``CheckpointUploadMode.NO_UPLOAD``; https://docs.ray.io/en/latest/train/
    user-guides/checkpoints.html) and Ray Train registers the checkpoint once every rank reported it, so a restarted
    group never sees one whose shards are not all written. The reports keep their order (one thread), and the
    training's own barriers (the final report, the preemption poll) wait for them, so every rank passes Ray Train's
    barriers in one order. Rank 0 emits a ``checkpoint`` event per save with the seconds training waited (the goodput
    ledger's "checkpoint saves"), one more when an optimizer step waited for the copy to host memory, one more when
    the preemption poll waited for the previous save's write and report and for the slower ranks at its barrier
    (``poll_wait_s``), and a
    ``checkpoint_written`` event with the save's whole duration."""

    def __init__(self, spec: RunSpec, model: Any, optimizer: Any, tokenizer: Any, rank: int, world: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.t, self.model, self.tokenizer, self.rank, self.world = spec.train, model, tokenizer, rank, world
        self.digest = training_digest(spec)
        self.optimizer = optimizer if spec.train.checkpoint_optimizer else None
        on_cpu = all(p.device.type == "cpu" for p in model.parameters())
        self.saver = AsyncSaver(background_staging=on_cpu, asynchronous=asynchronous(spec, on_cpu))
        self.saving_step = 0  # the step of the save whose copy to host memory may still be running
        self.saver.guard(optimizer, lambda seconds: self._waited(self.saving_step, seconds, {"copy_wait_s": seconds}))
        self.reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tpupipe-checkpoint-report")
        self.reported: Any = None  # the newest save's report: its future
        # Nothing announces a preemption where Ray Train's watcher is off (the local platform turns it off unless the
        # spec schedules a drain: components.platforms.local.cluster.preemption_environment;
        # RAY_TRAIN_ENABLE_PREEMPTION_WATCHER, ray/train/v2/_internal/constants.py): no poll there.
        self.watched = os.environ.get("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1").lower() not in ("0", "false")
        self.preempted = False

    def _reports_done(self) -> float | None:
        """Wait for the reports in flight (a failed one raises here, in the training's thread): the seconds waited,
        None when none was in flight."""
        if self.reported is None:
            return None
        started = time.perf_counter()
        self.reported.result()
        self.reported = None
        return time.perf_counter() - started

    def _meta(self, at: Position) -> checkpoints.CheckpointMeta:
        return {
            "epoch": at.epoch,
            "epoch_step": at.epoch_step,
            "global_step": at.global_step,
            "world": self.world,
            "base_model": self.t.model_id,
            "spec_digest": self.digest,  # what a restart checks before it resumes (checkpoints.load_sharded)
        }

    def sharded(self, at: Position, metrics: dict[str, Any]) -> None:
        import ray.train
        from ray.train import CheckpointUploadMode

        name = f"{SHARDED_PREFIX}{at.global_step:08d}"
        directory = self._storage() / name
        started = time.perf_counter()
        self._reports_done()  # the previous save's report (a failed one raises here)
        self.saving_step = at.global_step
        parts = self.saver.save(self.model, self.optimizer, self._meta(at), self.rank, directory)
        blocked = time.perf_counter() - started
        written, step = self.saver.pending, at.global_step

        def report() -> None:
            written.result()
            if self.rank == 0:
                whole = {"seconds": time.perf_counter() - started, "time": time.time()}
                protocol.emit("event", {"event": "checkpoint_written", "step": step, **whole})
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(str(directory)),
                checkpoint_dir_name=name,
                checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
            )

        self.reported = self.reporter.submit(report)
        self._waited(at.global_step, blocked, parts)

    def final(self, at: Position, metrics: dict[str, Any]) -> None:
        """The trained model, gathered to rank 0 (``checkpoints.save_final``), after the last sharded save is written
        and reported: what the registry and the evaluate stage read, the run's last checkpoint. Written once, by rank
        0 straight into the run's storage (``final_<step>``), and reported where it is
        (``CheckpointUploadMode.NO_UPLOAD``: Ray Train registers a checkpoint inside the run's directory without
        copying it: ``report`` in https://github.com/ray-project/ray/blob/ray-2.60.0/python/ray/train/v2/_internal/
        execution/context.py, the version the images pin); not first into the
        pod's temporary directory and then copied by Ray's upload (twice the bytes: ~11 GB for Gemma 4 E2B in
        float32)."""
        import ray.train
        from ray.train import CheckpointUploadMode

        started = time.perf_counter()
        self.saver.close()
        self._reports_done()
        self.reporter.shutdown()
        name = f"{FINAL_PREFIX}{at.global_step:08d}"
        directory = self._storage() / name
        if self.rank == 0:
            directory.mkdir(parents=True, exist_ok=True)
        meta = {**self._meta(at), "final": True, "loss": metrics.get("loss")}
        save_final(self.model, self.tokenizer, meta, self.rank, directory)
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(str(directory)) if self.rank == 0 else None,
            checkpoint_dir_name=name,
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )
        self._waited(at.global_step, time.perf_counter() - started)

    @staticmethod
    def _storage() -> Path:
        """The run's storage: a local path (locally the output root; on GKE the bucket's FUSE mount), DeveloperAPI."""
        import ray.train

        return Path(ray.train.get_context().get_storage().experiment_fs_path)

    def _waited(self, step: int, seconds: float, parts: dict[str, float] | None = None) -> None:
        """Rank 0's ``checkpoint`` event: the seconds training waited (and, for a sharded save, their parts:
        ``trainers.checkpoints.AsyncSaver.save``'s, or ``copy_wait_s`` when an optimizer step waited for the copy to
        host memory)."""
        if self.rank == 0:
            event = {"event": "checkpoint", "step": step, "seconds": seconds, "time": time.time(), **(parts or {})}
            protocol.emit("event", event)

    def after_step(self, at: Position, last_of_epoch: bool) -> None:
        """A sharded save every ``train.checkpoint_every_steps`` steps (the epoch's last is saved at its end), and at
        once when Ray Train announces a preemption of one of the workers' nodes (``ray.train.get_preemption_info``:
        Ray's node drain with its deadline, Ray 2.60 ``ray/train/v2/api/train_fn_utils.py``), asked every
        :data:`PREEMPTION_POLL_STEPS` steps because every rank must ask together (rank 0's answer, broadcast). After
        that save the workers train no further (:meth:`_hold`): the restarted group resumes at the next step. On GKE a
        Spot VM's preemption notice gives the pods 15 s of a 30 s graceful termination (SIGTERM to each container's
        main process, here ``ray start``; https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms,
        "Termination and graceful shutdown of Spot VMs"), and Ray 2.60's ``ray start`` turns that SIGTERM into a drain
        of its node with reason PREEMPTION and a deadline RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S away
        (``Node._drain_node_before_shutdown``, https://github.com/ray-project/ray/blob/ray-2.60.0/python/ray/
        _private/node.py): the drain this poll sees (locally, ``testing.drain_host_at_step`` gives that notice). A
        host lost without notice resumes from the newest committed checkpoint instead, and repeats the steps since:
        up to ``train.checkpoint_every_steps`` when the newest save was committed, up to twice that when the host was
        lost while that save was still being written (its previous one is then the newest committed), and, with
        ``train.checkpoint_every_steps`` 0, every step since the epoch began (only an epoch's end is saved then)."""
        if last_of_epoch:
            return
        every = self.t.checkpoint_every_steps
        # The poll first where a periodic save is due at the same step (with a period that divides
        # PREEMPTION_POLL_STEPS, every poll step is one): it waits for the previous save's report, which the save
        # would wait for anyway, and a preemption's save is then that step's save.
        if self.watched and not self.preempted and at.global_step % PREEMPTION_POLL_STEPS == 0:
            self._poll(at)
        if every and at.global_step % every == 0:
            self.sharded(at, {"global_step": at.global_step, "epoch": at.epoch + 1})

    def _poll(self, at: Position) -> None:
        """Ask Ray Train whether a preemption is announced (every rank together); on one, save and hold."""
        import ray.train

        # Ray Train's barriers in the same order on every rank: the previous save's write and report first. What
        # training waited for it is checkpoint time (the goodput ledger's "checkpoint saves"), not a step's: a
        # part of that save's wait, as an optimizer step's wait for its copy is. That is rank 0's own wait for
        # its report (``report_wait_s``) and then, at the poll's barrier, its wait for every slower rank's
        # (``barrier_wait_s``): Ray Train hands each rank's report to its controller on its own (a worker's
        # result queue holds one report, and a put waits until the controller has taken the one before:
        # ``_wait_then_report`` in ray/train/v2/_internal/execution/context.py, Ray 2.60), so one rank's
        # report may return well after rank 0's.
        started = time.perf_counter()
        waited = self._reports_done()
        info = ray.train.get_preemption_info()
        if waited is not None:
            whole = time.perf_counter() - started
            parts = {"poll_wait_s": whole, "report_wait_s": waited, "barrier_wait_s": whole - waited}
            self._waited(self.saving_step, whole, parts)
        if info is not None:
            self.preempted = True
            if self.rank == 0:
                print(f"preemption announced (ranks {info.preempted_ranks}): saving at step {at.global_step}")
            self.sharded(at, {"global_step": at.global_step, "epoch": at.epoch + 1, "preempted": True})
            self._hold(at, info)

    def _hold(self, at: Position, info: Any) -> None:
        """After the just-in-time save: wait for its report (Ray Train has registered the checkpoint once every rank
        it waits for reported it), say so, and train no further. Ray Train's controller keeps a preempted worker
        group running until every rank has exited or the drain's deadline (plus ``FailureConfig.preemption_grace_s``)
        has passed, then restarts it (``_handle_preempting_state`` in https://github.com/ray-project/ray/blob/
        ray-2.60.0/python/ray/train/v2/_internal/execution/controller/controller.py): every step trained after the
        save until then would be trained again by the group that restores it. Returning instead would end the
        training as a success at this step; raising would count as a failure of the run's own. So the workers wait,
        and the restarted group resumes at the step after the save: none repeated."""
        started = time.perf_counter()
        self._reports_done()
        if self.rank == 0:
            event = {
                "event": "preemption_checkpoint",
                "step": at.global_step,
                "report_s": time.perf_counter() - started,
                "preempted_ranks": list(info.preempted_ranks),
                "deadline_ms": info.deadline_ms,
                "time": time.time(),
            }
            protocol.emit("event", event)
        while True:  # until Ray Train stops this worker group
            time.sleep(1.0)
