"""FSDP2 fine-tuning through Ray Train's TorchTrainer: the workload of the GKE tutorial "Fine-tune models on
multi-host TPUs with Ray and TorchTPU" (docs/tutorials.md).

``python -m trainers.fsdp --spec JSON --output-dir DIR --run-name NAME --scaling-config JSON`` is the Ray job
entrypoint (``trainers.job_args``). The driver picks the collective backend from what the training workers have
(``tpu_dist`` with torch_tpu, ``nccl`` on CUDA, ``gloo`` on CPU), runs the TorchTrainer, and prints one ``TPUPIPE
result`` line. Rank 0 prints one ``TPUPIPE metric`` line per epoch and one ``step`` event per step. Over several
slices the model is sharded within a slice and replicated across them (HSDP, ``trainers.mesh``).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from components.spec import GENERATED_DATASET, RunSpec, protocol
from trainers import data, job_args, mesh

CHECKPOINT_META = "tpupipe_checkpoint.json"


class InjectedFailure(RuntimeError):
    """Raised by ``train.fail_at_step`` (training) and ``train.fail_eval`` (evaluation): a deliberate failure, for
    tests of the failure path."""


# ---------------------------------------------------------------- device and backend


def tpu_chips_on_host(dev: str = "/dev") -> int:
    """TPU chips this host exposes, where libtpu finds them: ``/dev/accel<n>`` (v4, v5p) or ``/dev/vfio/<n>``
    (v5e, v6e, TPU7x)."""
    vfio = [n for n in glob.glob(os.path.join(dev, "vfio", "*")) if os.path.basename(n).isdigit()]
    return len(glob.glob(os.path.join(dev, "accel[0-9]*"))) + len(vfio)


def detect_backend(dev: str = "/dev") -> tuple[str, str]:
    """(device type, process-group backend) from the chips this host has, not from what imports: torch_tpu imports on
    a host without chips and then registers no ``tpu`` device and no ``tpu_dist`` backend, and the torch image has it
    on every host. Chips without torch_tpu are a misbuilt image, an error; a TPU-shaped host without chips (an
    emulated slice) computes on CPU with gloo, torch_tpu installed or not."""
    chips = tpu_chips_on_host(dev)
    if chips:
        try:
            import torch_tpu  # noqa: F401
        except ImportError:
            raise RuntimeError(
                f"this host has {chips} TPU chips but the trainer image has no torch_tpu: build the torch image from "
                "images/torch (torch-tpu and libtpu come from PyPI), or on a TorchTPU base image"
            ) from None
        return "tpu", "tpu_dist"
    if not glob.glob(os.path.join(dev, "nvidia[0-9]*")):  # no NVIDIA GPU's device file: CPU, without importing torch
        return "cpu", "gloo"
    import torch

    if torch.cuda.is_available():
        return "cuda", "nccl"
    return "cpu", "gloo"


def worker_runtime_env(use_tpu: bool, device_type: str) -> dict[str, Any]:
    """Ray Train's per-worker runtime env. On a TPU slice without chips (emulated hosts) the workers still hold the
    slice's TPU resources, so Ray Train schedules and gang-reserves exactly as on TPU, but see no chip ids: an
    empty ``TPU_VISIBLE_CHIPS`` makes Ray give them no accelerator ids, so its Torch backend sets them up for CPU
    instead of looking for torch_tpu."""
    if use_tpu and device_type == "cpu":
        return {"env_vars": {"TPU_VISIBLE_CHIPS": ""}}
    return {}


# ---------------------------------------------------------------- checkpoints


def save_checkpoint(model, optimizer, tokenizer, meta: dict[str, Any], rank: int, directory: Path) -> None:
    """Gather the trained state to rank 0 and write it with the config and tokenizer. The frozen per-layer table is
    left out (``ignore_frozen_params``: it never changes, and in E2B it is ~4.7 GB of bf16): the model is the base
    model (``train.model_id``) with these weights loaded over it (``trainers.model.load_trained``). The optimizer
    state is written when ``optimizer`` is given (``train.checkpoint_optimizer``)."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    state = get_model_state_dict(model, options=options)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options) if optimizer is not None else None
    if rank != 0:
        return
    if model.config.get_text_config().tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(
        {k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"), metadata={"format": "pt"}
    )
    model.config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    if optim_state is not None:
        torch.save(optim_state, directory / "optimizer.pt")
    (directory / CHECKPOINT_META).write_text(json.dumps(meta))


class UnsafeCheckpoint(ValueError):
    """A checkpoint file holds more than tensors and plain containers: a pickle that would run code on load."""


def load_optimizer_state(path: Path) -> dict[str, Any]:
    """The optimizer state :func:`save_checkpoint` wrote, read with ``weights_only=True``: tensors, numbers,
    strings and plain containers only, so a file planted in the checkpoint directory cannot run code when a
    restarted worker group resumes from it
    (https://docs.pytorch.org/docs/stable/notes/serialization.html#weights-only-security)."""
    import pickle

    import torch

    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        lines = [line.strip() for line in str(e).splitlines() if "GLOBAL" in line or "Unsupported" in line]
        raise UnsafeCheckpoint(
            f"refusing to load {path}: it is not a plain optimizer state (tensors and containers only); "
            f"torch.load with weights_only=True said: {lines[0] if lines else str(e).strip()[:300]}"
        ) from None


def load_checkpoint(model, optimizer, directory: Path) -> dict[str, Any]:
    """Restore a checkpoint of :func:`save_checkpoint` into the sharded model (the frozen table stays the base
    model's) and, when it holds one, the optimizer state; without one the optimizer starts fresh. Weights are read
    from safetensors and the optimizer state with :func:`load_optimizer_state`: nothing here unpickles code."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    # Rank 0 reads the weights and the optimizer state and broadcasts them: one read of each file (on GKE, from the
    # bucket's FUSE mount), not one per rank; the other ranks give an empty state, which torch's state_dict API takes
    # with broadcast_from_rank0 (torch/distributed/checkpoint/state_dict.py, StateDictOptions).
    distributed = torch.distributed.is_initialized()  # (a single process, as in a test, reads it itself)
    rank0 = not distributed or torch.distributed.get_rank() == 0
    weights = load_file(str(directory / "model.safetensors")) if rank0 else {}
    broadcast = StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=distributed)
    set_model_state_dict(model, weights, options=broadcast)
    if (directory / "optimizer.pt").is_file():
        optim_state = load_optimizer_state(directory / "optimizer.pt") if rank0 else {}
        set_optimizer_state_dict(model, optimizer, optim_state, options=broadcast)
    return json.loads((directory / CHECKPOINT_META).read_text())


# ---------------------------------------------------------------- the loop each worker runs


def data_loader(dataset, batch_size: int, seed: int, world: int, rank: int):
    """This worker's batches, shuffled by ``train.seed``: with more than one worker a ``DistributedSampler`` of its
    own seeded by it (Ray's ``prepare_data_loader`` would add one with torch's default seed, 0, whatever the spec
    says), with one a generator seeded by it. drop_last: every step has the same shapes (a short last batch would
    recompile the step on XLA)."""
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    if world > 1:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed)
        return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True, generator=generator)


def _setup(spec: RunSpec, config: dict[str, Any], world: int, rank: int, device_type: str, device):
    """The worker's tokenizer, data loader, FSDP2-sharded model and optimizer, and the raw training split. The model
    is ``train.model_id`` as it is, or with a registered version's weights over it (``config["init_from"]``: the
    checkpoint ``train.init_from`` resolved to when the stage started)."""
    import ray.train.torch
    import torch

    from trainers.model import build_model, load_tokenizer, load_trained

    t = spec.train
    weights, compute = mesh.dtypes(device_type, t.precision)
    dtype = getattr(torch, weights)
    tokenizer = load_tokenizer(t.model_id)
    raw = data.load_split(t.dataset, t.train_split, config.get("data_files"), config.get("cache_dir"))
    loader = data_loader(data.tokenize(raw, tokenizer, t.max_length), t.batch_size, t.seed, world, rank)
    loader = ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False, move_to_device=False)
    if config.get("init_from"):
        model = load_trained(t.model_id, config["init_from"], tokenizer, t.seed, dtype)
    else:
        model = build_model(t.model_id, tokenizer, t.seed, dtype)
    model = mesh.parallelize(model.to(device), _mesh(spec, world, rank, device_type), compute)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=t.learning_rate, weight_decay=t.weight_decay
    )
    return tokenizer, loader, model, optimizer, raw


def _mesh(spec: RunSpec, world: int, rank: int, device_type: str):
    """The device mesh over the workers: 1-D on one slice; over several, 2-D (HSDP: replicate across the slices,
    shard within one), each rank placed by the slice its host is on (``trainers.mesh.slice_name``, the slice check's
    rule). Rank 0 prints it."""
    here = mesh.slice_here(spec.cluster.num_hosts)
    slices = mesh.gather_slices(here) if spec.cluster.num_slices > 1 and world > 1 else [here] * world
    built = mesh.device_mesh(device_type, mesh.layout(slices))
    if rank == 0:
        print(f"{mesh.describe(built)} over {world} workers on {len(set(slices))} slices", flush=True)
    return built


def _resume(model, optimizer, rank: int) -> tuple[int, int, bool]:
    """(first epoch, global step, resumed) from Ray Train's checkpoint after a restart, else a fresh start."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if not checkpoint:
        return 0, 0, False
    with checkpoint.as_directory() as directory:
        meta = load_checkpoint(model, optimizer, Path(directory))
    if rank == 0:
        print(f"resumed from checkpoint of epoch {meta['epoch'] + 1} (step {meta['global_step']})", flush=True)
    return meta["epoch"] + 1, meta["global_step"], True


def _run_epoch(spec: RunSpec, model, optimizer, loader, device, global_step: int, resumed: bool) -> tuple[Any, int]:
    """One pass over this worker's shard: (the summed loss, an fp32 tensor on the device, the global step after
    it). The loss stays on the device: nothing waits for the host inside the epoch (on XLA a ``.item()`` or a
    copy to the CPU each step would cut the traced graph and stall the pipeline). Rank 0 prints one short ``step``
    event per step with its wall-clock time (on XLA: when the step was dispatched), which shows how soon training
    resumes after a lost host."""
    import ray.train
    import torch

    fail_at = spec.train.fail_at_step
    timed = ray.train.get_context().get_world_rank() == 0
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    first_step, step_losses = global_step + 1, []
    total = len(loader) * spec.train.epochs  # the run's steps, for the progress bar
    tokens = spec.train.batch_size * ray.train.get_context().get_world_size() * spec.train.max_length  # a step's

    def step_ended(step: int) -> None:
        protocol.emit("event", {"event": "step", "step": step, "total": total, "tokens": tokens, "time": time.time()})

    for index, batch in enumerate(loader):
        loss = mesh.train_step(model, optimizer, batch, device)
        loss_sum += loss
        global_step += 1
        if timed:
            step_losses.append(loss)
            if index < len(loader) - 1:  # the epoch's last: once its loss is read (the progress bar shows it)
                step_ended(global_step)
        if fail_at and global_step == fail_at and not resumed:
            raise InjectedFailure(f"injected failure at step {global_step} (train.fail_at_step)")
    if step_losses:  # rank 0's loss of each step, read from the device once per epoch
        losses = torch.stack(step_losses).cpu().tolist()
        protocol.emit("event", {"event": "step_losses", "first_step": first_step, "losses": losses})
        step_ended(global_step)
    return loss_sum, global_step


def train_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist

    spec = RunSpec.from_json(config["spec"])
    t = spec.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device_type, _ = detect_backend()
    # What this worker has decides, not what the cluster was provisioned as: emulated TPU hosts compute on CPU.
    device = torch.device("cpu") if device_type == "cpu" else ray.train.torch.get_device()
    if rank == 0:
        protocol.emit("event", {"event": "worker_group_started", "world_size": world, "time": time.time()})
    tokenizer, loader, model, optimizer, raw = _setup(spec, config, world, rank, device_type, device)
    if rank == 0:  # what the model is trained on, for its provenance
        protocol.emit("event", {"event": "data", "data_snapshot": data.snapshot(raw), "num_examples": len(raw)})
    start_epoch, global_step, resumed = _resume(model, optimizer, rank)
    steps_per_epoch = len(loader)
    for epoch in range(start_epoch, t.epochs):
        if world > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        started = time.perf_counter()
        loss_sum, global_step = _run_epoch(spec, model, optimizer, loader, device, global_step, resumed)
        epoch_loss = loss_sum / steps_per_epoch
        dist.all_reduce(epoch_loss, op=dist.ReduceOp.SUM)  # the epoch's one collective on the loss; gloo has no AVG
        epoch_loss = (epoch_loss / world).item()
        epoch_s = time.perf_counter() - started
        metrics = {
            "epoch": epoch + 1,
            "loss": epoch_loss,
            "epoch_s": epoch_s,
            "global_step": global_step,
            "tokens_per_s": steps_per_epoch * t.batch_size * world * t.max_length / epoch_s,
            "tokens_seen": global_step * t.batch_size * world * t.max_length,
        }
        saving = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            meta = {"epoch": epoch, "global_step": global_step, "loss": epoch_loss, "base_model": t.model_id}
            save_checkpoint(model, optimizer if t.checkpoint_optimizer else None, tokenizer, meta, rank, Path(tmp))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)
        if rank == 0:  # the save and Ray Train's upload of it to the run's storage, for the goodput ledger
            saved = {"seconds": time.perf_counter() - saving, "time": time.time()}
            protocol.emit("event", {"event": "checkpoint", "step": global_step, **saved})
        if rank == 0:
            protocol.emit("metric", metrics)


# ---------------------------------------------------------------- the driver


def probe_backend(resources: dict[str, float]) -> tuple[str, str]:
    """Ask a worker-shaped task what it sees: the head may have no accelerator."""
    import ray

    custom = {k: v for k, v in resources.items() if k != "CPU"}
    task = ray.remote(detect_backend).options(num_cpus=resources.get("CPU", 0), resources=custom or None)
    return ray.get(task.remote())


def run(spec: RunSpec, scaling: dict[str, Any], output_dir: Path, run_name: str, init_from: str = "") -> dict[str, Any]:
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    t = spec.train
    output_dir.mkdir(parents=True, exist_ok=True)
    loop_config: dict[str, Any] = {
        "spec": spec.to_json(),
        "cache_dir": data.local_cache_dir(run_name),
        "init_from": init_from,
    }
    if t.dataset == GENERATED_DATASET:
        loop_config["data_files"] = data.write_generated(
            output_dir / "data", t.num_train_examples, t.num_eval_examples, t.seed
        )
    ray.init(log_to_driver=True)
    device_type, backend = probe_backend(scaling["resources_per_worker"])
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
            checkpoint_config=CheckpointConfig(
                num_to_keep=t.num_to_keep, checkpoint_score_attribute="loss", checkpoint_score_order="min"
            ),
            failure_config=FailureConfig(max_failures=t.max_failures),
            worker_runtime_env=worker_env,
        ),
    )
    result = trainer.fit()
    best = min(result.best_checkpoints, key=lambda pair: pair[1]["loss"]) if result.best_checkpoints else None
    checkpoint = best[0] if best else result.checkpoint
    return {
        "checkpoint": checkpoint.path if checkpoint else None,
        "final_metrics": result.metrics,
        "device": device_type,
        "backend": backend,
        "num_workers": scaling["num_workers"],
    }


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
    return job_args.parse(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args.spec, args.scaling_config, Path(args.output_dir), args.run_name, args.init_from)
    if result["final_metrics"] and not math.isfinite(result["final_metrics"].get("loss", 0.0)):
        raise SystemExit(f"training diverged: final loss {result['final_metrics']['loss']}")
    protocol.emit("result", result)


if __name__ == "__main__":
    main()
