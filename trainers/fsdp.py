"""FSDP2 fine-tuning through Ray Train's TorchTrainer: the workload of the GKE tutorial "Fine-tune models on
multi-host TPUs with Ray and TorchTPU" (docs/tutorials.md).

``python -m trainers.fsdp --spec JSON --output-dir DIR --run-name NAME --scaling-config JSON`` is the Ray job
entrypoint (``trainers.job_args``). The driver picks the collective backend from what the training workers have
(``tpu_dist`` with torch_tpu, ``nccl`` on CUDA, ``gloo`` on CPU; ``trainers.devices``), runs the TorchTrainer, and
prints one ``TPUPIPE result`` line. Rank 0 prints one ``TPUPIPE metric`` line per epoch and one ``step`` event per
step. Each epoch's end, every ``train.checkpoint_every_steps`` steps and an announced preemption write a sharded
checkpoint while training goes on (``trainers.checkpoints``), which a restarted worker group resumes from at the
batch it had reached; the end of training writes the trained model once. Over several slices the model is sharded
within a slice and replicated across them (HSDP, ``trainers.mesh``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from components.spec import RunSpec, protocol
from trainers import checkpoints, data, generation, heldout, job_args, mesh, ray_checkpoints
from trainers.devices import Worker, probe_backend, this_worker, worker_runtime_env


class InjectedFailure(RuntimeError):
    """Raised by ``testing.fail_at_step`` (training) and ``testing.fail_eval`` (evaluation): a deliberate failure, for
    tests of the failure path."""


# ---------------------------------------------------------------- the loop each worker runs


def data_loader(dataset: data.Tokenized | Sequence[Any], batch_size: int, seed: int, world: int, rank: int) -> Any:
    """This worker's batches, shuffled by ``train.seed`` and the epoch (``loader.sampler.set_epoch``): a
    ``DistributedSampler`` of its own seeded by it (Ray's ``prepare_data_loader`` would add one with torch's default
    seed, 0, whatever the spec says) that can start an epoch at a given batch (``loader.sampler.skip_batches``: a
    resume mid-epoch). drop_last: every step has the same shapes (a short last batch would recompile the step on
    XLA). A tokenised split (``trainers.data.Tokenized``) gives a batch whole, one gather per column: nothing to
    collate."""
    from torch.utils.data import DataLoader

    sampler = _resumable_sampler(dataset, batch_size, seed, world, rank)
    whole = hasattr(dataset, "__getitems__")
    return DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, drop_last=True, collate_fn=_as_is if whole else None
    )


def _as_is(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


def prefetched(loader: Iterable[dict[str, Any]], device: Any) -> Iterator[dict[str, Any]]:
    """The loader's batches on ``device``, each one's copy started before the step on the one before it runs: the
    next batch is read and on its way while the step is dispatched (asynchronous copies where the device has them;
    on the CPU a copy is nothing)."""

    def moved(batch: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if batch is None else {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    batches = iter(loader)
    ahead = moved(next(batches, None))
    while ahead is not None:
        batch, ahead = ahead, moved(next(batches, None))
        yield batch


def _resumable_sampler(
    dataset: data.Tokenized | Sequence[Any], batch_size: int, seed: int, world: int, rank: int
) -> Any:
    from torch.utils.data import DistributedSampler

    class ResumableSampler(DistributedSampler):  # type: ignore[misc]  # a torch class: Any here (no type information)
        """DistributedSampler's order for the epoch, less its first ``skip_batches`` batches."""

        skip_batches = 0

        def __iter__(self) -> Iterator[int]:
            return iter(list(super().__iter__())[self.skip_batches * batch_size :])

        def __len__(self) -> int:
            whole: int = super().__len__()
            return max(0, whole - self.skip_batches * batch_size)

    return ResumableSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)


def _setup(
    spec: RunSpec, config: dict[str, Any], worker: Worker, phases: Phases
) -> tuple[data.Tokenizer, Any, Any, Any, data.Examples]:
    """The worker's tokenizer, data loader, FSDP2-sharded model and optimizer, and the raw training split, each
    timed in ``phases``. The model is ``train.model_id`` as it is, or with a registered version's weights over it
    (``config["init_from"]``: the checkpoint ``train.init_from`` resolved to when the stage started). The tokenised
    split comes from the run's cache directory (``config["cache"]``: per run, ``components.stages.compile_cache``)
    when an earlier worker group of the run left it there (``trainers.data.tokenize``); rank 0 keeps it there
    otherwise."""
    import torch

    from trainers import weights_check
    from trainers.model import build_model, load_tokenizer, load_trained

    t = spec.train
    rank, world = worker.rank, worker.world
    weights, compute = mesh.dtypes(worker.device_type, t.precision)
    dtype = getattr(torch, weights)
    with weights_check.loading():  # the host's checked copy of the base weights, let go once the model is loaded
        with phases.timed("tokenizer"):
            tokenizer = load_tokenizer(t.model_id)
        with phases.timed("data"):
            raw = data.load_split(t.dataset, data.splits(spec)[0], config.get("data_files"), config.get("cache_dir"))
            tokenized = data.tokenize(raw, tokenizer, t.max_length, config.get("cache", ""), write=rank == 0)
            loader = data_loader(tokenized, t.batch_size, t.seed, world, rank)
        phases.facts["tokenized_cached"] = tokenized.cached
        with phases.timed("model"):
            if config.get("init_from"):
                model = load_trained(t.model_id, config["init_from"], tokenizer, t.seed, dtype)
            else:
                model = build_model(t.model_id, tokenizer, t.seed, dtype)
    with phases.timed("shard"):
        model = mesh.shard_from_host(model, _mesh(spec, world, rank, worker.device_type), compute, worker.device)
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=t.learning_rate, weight_decay=t.weight_decay
        )
    return tokenizer, loader, model, optimizer, raw


class Phases:
    """Where a worker's start goes, in seconds by phase (rank 0 prints them as one ``setup`` event, which the
    recurring bench compares across runs), and facts about it (the cache's hits)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.facts: dict[str, Any] = {}

    def timed(self, name: str) -> AbstractContextManager[None]:
        import contextlib

        @contextlib.contextmanager
        def timing() -> Iterator[None]:
            started = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - started, 3)

        return timing()


def _mesh(spec: RunSpec, world: int, rank: int, device_type: str) -> Any:
    """The device mesh over the workers: 1-D on one slice; over several, 2-D (HSDP: replicate across the slices,
    shard within one), each rank placed by the slice its host is on (``trainers.mesh.slice_name``, the slice check's
    rule). Rank 0 prints it."""
    here = mesh.slice_here(spec.cluster.num_hosts)
    slices = mesh.gather_slices(here) if spec.cluster.num_slices > 1 and world > 1 else [here] * world
    built = mesh.device_mesh(device_type, mesh.layout(slices))
    if rank == 0:
        print(f"{mesh.describe(built)} over {world} workers on {len(set(slices))} slices", flush=True)
    return built


def _resume(
    model: Any, optimizer: Any, rank: int, world: int, digest: str, group: Any
) -> tuple[checkpoints.Position, bool]:
    """Where to start after a restart: the newest committed sharded checkpoint in the run's storage, as rank 0 chose
    it for every rank (``ray_checkpoints.restore_point``, which prunes what no restore needs), else Ray Train's
    latest, restored with the batch of the epoch it had reached (in samples, so a group of another size starts at
    the same point of the epoch's order); else a fresh start. Rank 0
    emits a ``restored`` event with the restore's seconds. A checkpoint written under another training spec than
    ``digest`` is refused (``checkpoints.load_sharded``). DCP's own collectives run on ``group`` (the checkpointer's
    gloo group)."""
    import ray.train

    started = time.perf_counter()
    checkpoint = ray.train.get_checkpoint()
    storage = Path(ray.train.get_context().get_storage().experiment_fs_path)
    newest = ray_checkpoints.restore_point(storage, rank)
    if newest is not None:  # Ray Train's latest is one of these, or an older one
        meta = checkpoints.load_sharded(model, optimizer, newest, digest, group)
    elif checkpoint:
        with checkpoint.as_directory() as directory:
            if not checkpoints.is_sharded(Path(directory)):
                raise RuntimeError(f"the latest checkpoint ({checkpoint.path}) is the trained model: training ended")
            meta = checkpoints.load_sharded(model, optimizer, Path(directory), digest, group)
    else:
        return checkpoints.Position(), False
    if rank == 0:  # the restore's seconds: a part of the time from a lost host to the first new step
        print(f"resumed from checkpoint of epoch {meta['epoch'] + 1} (step {meta['global_step']})", flush=True)
        restored = {"step": meta["global_step"], "seconds": time.perf_counter() - started, "time": time.time()}
        protocol.emit("event", {"event": "restored", **restored})
    epoch_step = meta["epoch_step"] * meta["world"] // world
    return checkpoints.Position(meta["epoch"], epoch_step, meta["global_step"]), True


def _run_epoch(
    spec: RunSpec,
    model: Any,
    optimizer: Any,
    loader: Any,
    device: Any,
    at: checkpoints.Position,
    resumed: bool,
    saves: ray_checkpoints.Checkpointer,
) -> tuple[Any, int]:
    """The rest of this worker's shard of the epoch ``at`` is in: (the summed loss, an fp32 tensor on the device, the
    steps run). The loss stays on the device: nothing waits for the host inside the epoch (on XLA a ``.item()`` or
    a copy to the CPU each step would cut the traced graph and stall the pipeline). Rank 0 prints one short ``step``
    event per step with its wall-clock time (on XLA: when the step was dispatched), which shows how soon training
    resumes after a lost host."""
    import ray.train
    import torch

    fail_at = spec.testing.fail_at_step
    timed = ray.train.get_context().get_world_rank() == 0
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    first_step, step_losses, ran = at.global_step + 1, [], 0
    steps_per_epoch = at.epoch_step + len(loader)
    total = steps_per_epoch * spec.train.epochs  # the run's steps, for the progress bar
    tokens = spec.train.batch_size * ray.train.get_context().get_world_size() * spec.train.max_length  # a step's

    def step_ended(step: int) -> None:
        protocol.emit("event", {"event": "step", "step": step, "total": total, "tokens": tokens, "time": time.time()})

    for batch in prefetched(loader, device):
        loss = mesh.train_step(model, optimizer, batch, device)
        loss_sum += loss
        at.global_step += 1
        at.epoch_step += 1
        ran += 1
        last = at.epoch_step == steps_per_epoch
        if timed:
            step_losses.append(loss)
            if not last:  # the epoch's last: once its loss is read (the progress bar shows it)
                step_ended(at.global_step)
        if fail_at and at.global_step == fail_at and not resumed:
            raise InjectedFailure(f"injected failure at step {at.global_step} (testing.fail_at_step)")
        saves.after_step(at, last)
    if step_losses:  # rank 0's loss of each step, read from the device once per epoch
        losses = torch.stack(step_losses).cpu().tolist()
        protocol.emit("event", {"event": "step_losses", "first_step": first_step, "losses": losses})
        step_ended(at.global_step)
    return loss_sum, ran


def train_loop_per_worker(config: dict[str, Any]) -> None:
    phases = Phases()
    with phases.timed("imports"):  # torch and Ray Train's torch module: trainers.devices.this_worker's, timed here
        import ray.train
        import ray.train.torch  # noqa: F401
        import torch  # noqa: F401
        import torch.distributed as dist

    spec = RunSpec.from_json(config["spec"])
    t = spec.train
    worker = this_worker()
    rank, world, device = worker.rank, worker.world, worker.device
    if rank == 0:
        protocol.emit("event", {"event": "worker_group_started", "world_size": world, "time": time.time()})
    tokenizer, loader, model, optimizer, raw = _setup(spec, config, worker, phases)
    if rank == 0:  # what the model is trained on, for its provenance
        snapshot = {"data_snapshot": data.snapshot(raw), "num_examples": len(raw), "time": time.time()}
        protocol.emit("event", {"event": "data", **snapshot})
    with phases.timed("resume"):
        saves = ray_checkpoints.Checkpointer(spec, model, optimizer, tokenizer, rank, world)
        at, resumed = _resume(model, optimizer, rank, world, checkpoints.training_digest(spec), saves.saver.group)
    with phases.timed("evaluation_split"):
        evaluation = heldout.InJob(spec, config, tokenizer, worker)  # no reload to evaluate
        answering = generation.Answering(spec, config, tokenizer, worker)
    evaluation.before(model, resumed)
    # The model as built answers the evaluation prompts (a resumed group's did already), scored after training with
    # the trained model's answers: rank 0 scores while no rank waits in a collective, however slow a team's scorer.
    # A registered version training starts from has its answers recorded, or answers in the evaluation job
    # (components.stages.answers).
    if not resumed and not config.get("init_from"):
        answering.kept(model, "before")
    if rank == 0:
        protocol.emit("event", {"event": "setup", "phases": phases.seconds, **phases.facts, "time": time.time()})
    steps_per_epoch = len(loader)
    if at.epoch_step >= steps_per_epoch:  # saved at an epoch's end: the next one
        at = checkpoints.Position(at.epoch + 1, 0, at.global_step)
    metrics: dict[str, Any] = {}
    for epoch in range(at.epoch, t.epochs):
        loader.sampler.set_epoch(epoch)
        loader.sampler.skip_batches = at.epoch_step if epoch == at.epoch else 0
        at.epoch, at.epoch_step = epoch, loader.sampler.skip_batches
        model.train()
        started = time.perf_counter()
        loss_sum, ran = _run_epoch(spec, model, optimizer, loader, device, at, resumed, saves)
        epoch_loss = loss_sum / max(1, ran)
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.SUM)  # the epoch's one collective on the loss; gloo has no AVG
        epoch_loss = (epoch_loss / world).item()
        epoch_s = time.perf_counter() - started
        metrics = {
            "epoch": epoch + 1,
            "loss": epoch_loss,
            "epoch_s": epoch_s,
            "global_step": at.global_step,
            "tokens_per_s": ran * t.batch_size * world * t.max_length / epoch_s,
            "tokens_seen": at.global_step * t.batch_size * world * t.max_length,
        }
        if epoch + 1 == t.epochs:  # the trained model on the held-out split, reported with its checkpoint
            metrics.update(evaluation.after(model))
        if epoch < t.epochs - 1:
            saves.sharded(at, metrics)
        else:
            saves.final(at, metrics)
            answering(model, "after")  # once the trained model is saved: an answering that fails loses nothing
            answering.score_kept("before")  # rank 0, past training's last collective
        if rank == 0:
            protocol.emit("metric", metrics)


# ---------------------------------------------------------------- the driver


def run(
    spec: RunSpec, scaling: dict[str, Any], output_dir: Path, run_name: str, init_from: str = "", cache: str = ""
) -> dict[str, Any]:
    # Ray Train V2's classes, which ray.train exports at run time (Ray 2.60), imported from where they are defined:
    # ray.train's own names are V1's to a type checker, which does not run its choice of version
    import ray
    from ray.train.torch import TorchConfig
    from ray.train.v2.api.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    t = spec.train
    output_dir.mkdir(parents=True, exist_ok=True)
    loop_config: dict[str, Any] = {
        "spec": spec.to_json(),
        "cache_dir": data.local_cache_dir(run_name),
        "init_from": init_from,
        "cache": cache,
        "output_dir": str(output_dir),  # the answers to the evaluation prompts go under it (trainers.generation)
    }
    files = data.job_files(spec, output_dir)
    if files is not None:
        loop_config["data_files"] = files
    ray.init(log_to_driver=True)
    device_type, backend = probe_backend(scaling)
    worker_env = worker_runtime_env(scaling.get("use_tpu", False), device_type)
    print(
        f"workers: {scaling['num_workers']} x {scaling['resources_per_worker']} on {device_type}, "
        f"backend {backend}" + (" (TPU slice without chips: emulated hosts compute on CPU)" if worker_env else ""),
        flush=True,
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(
            name=run_name,
            storage_path=str(output_dir / "ray_results"),
            # The latest checkpoints kept (no score: by the order reported); the last is the trained model.
            checkpoint_config=CheckpointConfig(num_to_keep=t.num_to_keep),
            # Preemptions (Ray's node drains) retried apart from max_failures, as often as they come (Ray 2.60's
            # FailureConfig.max_preemption_failures, -1: no limit): a preempted Spot slice is not the job's fault.
            # Ray Train's collectives are not relaxed on a preemption (relax_collectives_on_preemption, and no
            # preemption_grace_s past the deadline): the just-in-time save is DCP's, a collective of every rank
            # (its shards written by each, its index gathered by rank 0), so it commits only while the preempted
            # ranks live, and they take part in Ray Train's barriers then too: Ray's docs call the relaxation
            # unnecessary "when a training step plus a checkpoint fits comfortably inside that window, since the
            # preempted workers are then still alive" (FailureConfig, https://github.com/ray-project/ray/blob/
            # ray-2.60.0/python/ray/train/v2/api/config.py). Relaxed, it broke that save: rank 0 passed the poll's
            # broadcast alone and began the save while the preempted rank still waited at the broadcast, and DCP's
            # gather on rank 0 failed when that rank's host was killed (a failure of the run's, not a preemption).
            failure_config=FailureConfig(
                max_failures=t.max_failures,
                max_preemption_failures=-1,
                relax_collectives_on_preemption=False,
                preemption_grace_s=0.0,
            ),
            worker_runtime_env=_with_compile_cache(worker_env, device_type, cache, t.torch_tpu_compile_cache),
        ),
    )
    result = trainer.fit()
    checkpoint = result.checkpoint  # the last reported: the trained model (Checkpointer.final)
    return {
        "checkpoint": checkpoint.path if checkpoint else None,
        "final_metrics": result.metrics,
        "heldout": heldout.of_checkpoint(result.metrics),  # the final report's: the trained model's figure
        "device": device_type,
        "backend": backend,
        "num_workers": scaling["num_workers"],
    }


# TorchTPU's persistent cache of compiled executables, read at the backend's start: documented by vLLM's TorchTPU
# backend ("set TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT to a persistent directory path", "Native torch_tpu C++
# backend", https://github.com/vllm-project/vllm-torchtpu/blob/main/docs/user_guide/compilation_cache.md). No public
# source says how torch_tpu treats a damaged entry or a directory it cannot create, nor which versions it keys
# entries by, and no training run on a TPU has shown it hit: it is set only with train.torch_tpu_compile_cache=true.
# The directory is the run's cache keyed by image, slice and model (components.workload.cache), so another image never
# reads it.
TORCH_TPU_CACHE_ENV = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"


def _with_compile_cache(worker_env: dict[str, Any], device_type: str, cache: str, enabled: bool) -> dict[str, Any]:
    """The workers' runtime env, on TPU with TorchTPU's compile cache in the run's cache (``cache``/torch_tpu) when
    ``enabled`` (``train.torch_tpu_compile_cache``)."""
    if device_type != "tpu" or not cache or not enabled:
        return worker_env
    return {**worker_env, "env_vars": {**worker_env.get("env_vars", {}), TORCH_TPU_CACHE_ENV: f"{cache}/torch_tpu"}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The job's options (``components.workload.derive.job_command`` writes them)."""
    p = job_args.parser(
        "FSDP2 fine-tune through Ray Train's TorchTrainer.", "where checkpoints and data go", "Ray Train run name"
    )
    p.add_argument(
        "--init-from",
        default="",
        help="a checkpoint of this trainer to start from (its weights over "
        "train.model_id): the registered version train.init_from names",
    )
    p.add_argument(
        "--compile-cache",
        default="",
        help="the run's own cache directory for this image, slice and model (components.workload.cache): the "
        "tokenised training split is kept there, and on TPU TorchTPU's compiled executables",
    )
    return job_args.parse(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(
        args.spec, args.scaling_config, Path(args.output_dir), args.run_name, args.init_from, args.compile_cache
    )
    if result["final_metrics"] and not math.isfinite(result["final_metrics"].get("loss", 0.0)):
        raise SystemExit(f"training diverged: final loss {result['final_metrics']['loss']}")
    protocol.emit("result", result)


if __name__ == "__main__":
    main()
