"""Held-out loss and perplexity of the fine-tuned checkpoint, of the model training started from and, when the
registered model has one, of its champion, side by side on the same held-out examples in the same job.

``python -m trainers.evaluate --spec JSON --checkpoint DIR --output-dir DIR --run-name NAME --scaling-config JSON
[--init-from DIR] [--champion DIR]`` is the Ray job entrypoint. It runs Ray Train's TorchTrainer with the train
job's workers (one per TPU device, or one per emulated host on CPU): each model is sharded as for training (FSDP2,
bf16 on TPU), every worker evaluates its share of the held-out split, and the sums meet in one all_reduce per model.
The "before" model is ``train.model_id`` as built, or the checkpoint training started from (``--init-from``); a
checkpoint named twice (the champion training started from) is measured once. Prints one ``TPUPIPE result`` line.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec, protocol
from trainers import data, job_args


def shard_batches(ds, rank: int, world: int, batch_size: int) -> list[dict[str, Any]]:
    """This worker's share of the split (examples ``rank, rank + world, ...``) in batches of one shape. Every worker
    runs the same number of forward passes (each one is a collective under FSDP): a worker with fewer examples
    pads with copies of the first example whose labels are masked, so they add neither loss nor tokens."""
    indices = list(range(rank, len(ds), world))
    num_batches = math.ceil(math.ceil(len(ds) / world) / batch_size)
    batches = []
    for b in range(num_batches):
        chunk = indices[b * batch_size : (b + 1) * batch_size]
        rows = ds[chunk + [0] * (batch_size - len(chunk))]
        rows["labels"][len(chunk) :] = -100
        batches.append(rows)
    return batches


def heldout_sums(model, batches, device):
    """(summed next-token loss, target tokens) over the batches, as one fp32 tensor on the device: nothing waits
    for the host until the caller's all_reduce."""
    import torch

    model.eval()
    sums = torch.zeros(2, dtype=torch.float32, device=device)
    with torch.no_grad():
        for batch in batches:
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.size(-1)),
                targets.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            sums += torch.stack([loss, (targets != -100).sum().float()])
    return sums


def models_to_measure(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(which, checkpoint) of each model the job measures, in order: ``before`` (``""``: ``train.model_id`` as
    built), ``after`` (the fine-tuned checkpoint) and, when given, ``champion``."""
    models = [("before", config.get("init_from") or ""), ("after", config["checkpoint"])]
    if config.get("champion"):
        models.append(("champion", config["champion"]))
    return models


def eval_progress(which: str, index: int, num_models: int, num_batches: int) -> None:
    """The evaluation's progress record after its ``index``-th model of ``num_models`` (``num_batches`` each)."""
    done, total = (index + 1) * num_batches, num_models * num_batches
    protocol.emit("event", {"event": "eval_model", "which": which, "done": done, "total": total, "time": time.time()})


def _measured(rank: int, which: str, index: int, num_models: int, num_batches: int) -> None:
    if rank == 0:
        eval_progress(which, index, num_models, num_batches)


def eval_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainers.devices import detect_backend
    from trainers.fsdp import InjectedFailure
    from trainers.mesh import dtypes, parallelize
    from trainers.model import build_model, load_tokenizer, load_trained

    spec = RunSpec.from_json(config["spec"])
    t = spec.train
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if t.fail_eval:
        raise InjectedFailure(f"injected failure in evaluation on rank {rank} (train.fail_eval)")
    device_type, _ = detect_backend()
    device = torch.device("cpu") if device_type == "cpu" else ray.train.torch.get_device()
    weights, compute = dtypes(device_type, t.precision)  # as the trainer computes (trainers.mesh.dtypes)
    dtype = getattr(torch, weights)
    tokenizer = load_tokenizer(t.model_id)
    raw = data.load_split(t.dataset, data.splits(spec)[1], config.get("data_files"), config.get("cache_dir"))
    batches = shard_batches(data.tokenize(raw, tokenizer, t.max_length), rank, world, t.batch_size)
    mesh = init_device_mesh(device_type, (world,))
    losses, measured = {}, {}
    models = models_to_measure(config)
    for index, (which, source) in enumerate(models):
        if source in measured:
            losses[which] = measured[source]
            _measured(rank, which, index, len(models), len(batches))
            continue
        if source:
            model = load_trained(t.model_id, source, tokenizer, t.seed, dtype)
        else:
            model = build_model(t.model_id, tokenizer, t.seed, dtype)
        model = parallelize(model.to(device), mesh, compute)
        sums = heldout_sums(model, batches, device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        total, count = sums.tolist()
        losses[which] = measured[source] = total / max(count, 1.0)
        del model
        _measured(rank, which, index, len(models), len(batches))
    metrics = {f"eval_loss_{which}": loss for which, loss in losses.items()}
    metrics.update(num_eval_examples=len(raw), num_workers=world, device=device_type)
    # The figures reach the driver as Ray Train's result, which keeps the metrics of a report with a checkpoint.
    with tempfile.TemporaryDirectory() as tmp:
        if rank == 0:
            Path(tmp, "metrics.json").write_text(json.dumps(metrics))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)


def run(
    spec: RunSpec,
    scaling: dict[str, Any],
    checkpoint: str,
    output_dir: Path,
    run_name: str,
    init_from: str = "",
    champion: str = "",
) -> dict[str, Any]:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from trainers.devices import probe_backend, worker_runtime_env

    config: dict[str, Any] = {
        "spec": spec.to_json(),
        "checkpoint": checkpoint,
        "init_from": init_from,
        "champion": champion,
        "cache_dir": data.local_cache_dir(run_name),
    }
    files = data.job_files(spec, output_dir)
    if files is not None:
        config["data_files"] = files
    ray.init(log_to_driver=True)
    device_type, backend = probe_backend(scaling["resources_per_worker"])
    print(
        f"evaluating on {scaling['num_workers']} workers x {scaling['resources_per_worker']} ({device_type}, "
        f"{backend})",
        flush=True,
    )
    trainer = TorchTrainer(
        eval_loop_per_worker,
        train_loop_config=config,
        torch_config=TorchConfig(backend=backend),
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(
            name=f"{run_name}-eval",
            storage_path=str(output_dir / "ray_results"),
            failure_config=FailureConfig(max_failures=0),
            worker_runtime_env=worker_runtime_env(scaling.get("use_tpu", False), device_type),
        ),
    )
    metrics = dict(trainer.fit().metrics)
    before, after = metrics["eval_loss_before"], metrics["eval_loss_after"]
    result = {
        "eval_loss_before": before,
        "eval_loss_after": after,
        "perplexity_before": math.exp(before),
        "perplexity_after": math.exp(after),
        "num_eval_examples": metrics["num_eval_examples"],
        "num_workers": metrics["num_workers"],
        "device": metrics["device"],
        "eval_split": data.splits(spec)[1],
    }
    if "eval_loss_champion" in metrics:
        result.update(
            champion_loss=metrics["eval_loss_champion"], perplexity_champion=math.exp(metrics["eval_loss_champion"])
        )
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The job's options (``components.workload.derive.job_command`` writes them)."""
    p = job_args.parser(
        "Held-out loss before vs after fine-tuning, on the training devices.",
        "the run's training output directory",
        "Ray Train run name (of the train job)",
    )
    p.add_argument("--checkpoint", required=True, help="the fine-tuned checkpoint directory")
    p.add_argument(
        "--init-from",
        default="",
        help="the checkpoint training started from (the 'before' model); default: train.model_id as built",
    )
    p.add_argument("--champion", default="", help="the registered champion's checkpoint, measured alongside")
    return job_args.parse(p, argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(
        args.spec,
        args.scaling_config,
        args.checkpoint,
        Path(args.output_dir),
        args.run_name,
        args.init_from,
        args.champion,
    )
    protocol.emit("result", result)


if __name__ == "__main__":
    main()
