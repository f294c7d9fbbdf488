"""Held-out loss of the fine-tuned checkpoint, of the model training started from and, when the registered model
has one, of its champion, side by side on the same held-out examples in the same job: the figures the evaluate stage
does not have yet (the train job measures the model it trained, and the model as built, itself: ``trainers.heldout``;
a registered version's figure on the same examples is the registry's).

``python -m trainers.evaluate --spec JSON --checkpoint DIR --output-dir DIR --run-name NAME --scaling-config JSON
[--init-from DIR] [--champion DIR] [--measure before,after,champion]`` is the Ray job entrypoint. It runs Ray Train's
TorchTrainer with the train job's workers (one per TPU device, or one per emulated host on CPU): each model is sharded
as for training (FSDP2, bf16 on TPU), every worker evaluates its share of the held-out split, and the sums meet in one
all_reduce per model.
The "before" model is ``train.model_id`` as built, or the checkpoint training started from (``--init-from``); a
checkpoint named twice (the champion training started from) is measured once. Prints one ``TPUPIPE result`` line.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec, protocol
from trainers import data, generation, heldout, job_args

MODELS = ("before", "after", "champion")


def models_to_measure(config: dict[str, Any]) -> list[tuple[str, str]]:
    """(which, checkpoint) of each model the job measures, in order: ``before`` (``""``: ``train.model_id`` as
    built), ``after`` (the fine-tuned checkpoint) and, when given, ``champion``; only those ``measure`` names when it
    is given (the figures the evaluate stage does not have yet)."""
    models = [("before", config.get("init_from") or ""), ("after", config["checkpoint"])]
    if config.get("champion"):
        models.append(("champion", config["champion"]))
    wanted = config.get("measure") or MODELS
    return [(which, source) for which, source in models if which in wanted]


def eval_progress(which: str, index: int, num_models: int, num_batches: int) -> None:
    """The evaluation's progress record after its ``index``-th model of ``num_models`` (``num_batches`` each)."""
    done, total = (index + 1) * num_batches, num_models * num_batches
    protocol.emit("event", {"event": "eval_model", "which": which, "done": done, "total": total, "time": time.time()})


def _measured(rank: int, which: str, index: int, num_models: int, num_batches: int) -> None:
    if rank == 0:
        eval_progress(which, index, num_models, num_batches)


def eval_loop_per_worker(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from trainers import weights_check
    from trainers.devices import this_worker
    from trainers.fsdp import InjectedFailure
    from trainers.mesh import dtypes, parallelize
    from trainers.model import build_model, load_tokenizer, load_trained

    spec = RunSpec.from_json(config["spec"])
    t = spec.train
    worker = this_worker()
    rank, world, device_type, device = worker.rank, worker.world, worker.device_type, worker.device
    if spec.testing.fail_eval:
        raise InjectedFailure(f"injected failure in evaluation on rank {rank} (testing.fail_eval)")
    weights, compute = dtypes(device_type, t.precision)  # as the trainer computes (trainers.mesh.dtypes)
    dtype = getattr(torch, weights)
    with weights_check.loading():  # the host's checked copy of the base weights, let go after the last model
        tokenizer = load_tokenizer(t.model_id)
        split = heldout.Split(spec, config, tokenizer, worker)
        batches = split.batches
        mesh = init_device_mesh(device_type, (world,))
        losses: dict[str, float] = {}
        measured: dict[str, float] = {}  # a model's source -> its loss
        answering = generation.Answering(spec, config, tokenizer, worker)
        wanted_answers = set(config.get("generate") or ())
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
            losses[which] = measured[source] = heldout.loss(model, batches, device)
            if which in wanted_answers:  # its answers to the evaluation prompts (trainers.generation)
                answering(model, which)
            del model
            _measured(rank, which, index, len(models), len(batches))
    metrics: dict[str, Any] = {f"eval_loss_{which}": loss for which, loss in losses.items()}
    metrics.update(num_eval_examples=len(split.raw), num_workers=world, device=device_type, eval_key=split.key)
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
    measure: tuple[str, ...] = MODELS,
    generate: tuple[str, ...] = (),
) -> dict[str, Any]:
    # Ray Train V2's classes, which ray.train exports at run time (Ray 2.60), imported from where they are defined:
    # ray.train's own names are V1's to a type checker, which does not run its choice of version
    import ray
    from ray.train.torch import TorchConfig
    from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    from trainers.devices import probe_backend, worker_runtime_env

    config: dict[str, Any] = {
        "spec": spec.to_json(),
        "checkpoint": checkpoint,
        "init_from": init_from,
        "champion": champion,
        "measure": list(measure),
        "generate": list(generate),
        "output_dir": str(output_dir),  # the answers go under it (trainers.generation)
        "cache_dir": data.local_cache_dir(run_name),
    }
    files = data.job_files(spec, output_dir)
    if files is not None:
        config["data_files"] = files
    ray.init(log_to_driver=True)
    device_type, backend = probe_backend(scaling)
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
    metrics = trainer.fit().metrics
    if metrics is None:  # rank 0 reports every figure, with a checkpoint (eval_loop_per_worker)
        raise RuntimeError("the evaluation job's workers reported no figures")
    return measured(dict(metrics), data.splits(spec)[1])


def measured(metrics: dict[str, Any], eval_split: str) -> dict[str, Any]:
    """The job's result: each figure it measured (``eval_loss_before``, ``eval_loss_after``, ``champion_loss``) and
    what they were measured on; the evaluate stage adds what it had already."""
    names = {"before": "eval_loss_before", "after": "eval_loss_after", "champion": "champion_loss"}
    result = {names[which]: metrics[f"eval_loss_{which}"] for which in MODELS if f"eval_loss_{which}" in metrics}
    keep = ("num_eval_examples", "num_workers", "device", "eval_key")
    return {**result, **{k: metrics[k] for k in keep if k in metrics}, "eval_split": eval_split}


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
    add_measure(p)
    add_generate(p)
    return job_args.parse(p, argv)


def add_measure(p: argparse.ArgumentParser) -> None:
    """``--measure``: which of before, after and champion the job measures (comma-separated; default all): the
    evaluate stage names only the figures it does not have yet."""
    p.add_argument("--measure", type=measure_list, default=MODELS, help="before,after,champion (default: all)")


def add_generate(p: argparse.ArgumentParser) -> None:
    """``--generate``: which of the measured models also answer the evaluation prompts (``trainers.generation``)."""
    p.add_argument(
        "--generate",
        type=lambda text: measure_list(text) if text.strip() else (),
        default=(),
        help="which of the measured models also answer the evaluation prompts (comma-separated; default none)",
    )


def measure_list(text: str) -> tuple[str, ...]:
    words = tuple(w.strip() for w in text.split(",") if w.strip())
    unknown = [w for w in words if w not in MODELS]
    if unknown or not words:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of {', '.join(MODELS)}")
    return words


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
        args.measure,
        args.generate,
    )
    protocol.emit("result", result)


if __name__ == "__main__":
    main()
