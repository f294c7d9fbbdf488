"""Held-out loss and perplexity of the fine-tuned checkpoint and of the untrained model, as a Ray job.

``python -m trainers.evaluate --spec JSON --checkpoint DIR --output-dir DIR`` evaluates both models on the
same held-out split inside one Ray task placed like a training worker, and prints one ``TPUPIPE result`` line.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from components.spec import GENERATED_DATASET, RunSpec, protocol
from trainers import data


def heldout_loss(model, loader) -> float:
    """Mean next-token loss over every non-padding target token of the split."""
    import torch

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            losses = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.size(-1)),
                targets.reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            total += losses.item()
            count += int((targets != -100).sum())
    return total / max(count, 1)


def evaluate(spec_json: str, checkpoint: str, data_files: dict[str, str] | None, cache_dir: str) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    from trainers.model import build_model, load_pretrained, load_tokenizer

    spec = RunSpec.from_json(spec_json)
    t = spec.train
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(t.model_id)
    raw = data.load_split(t.dataset, t.eval_split, data_files, cache_dir)
    loader = DataLoader(data.tokenize(raw, tokenizer, t.max_length), batch_size=max(t.batch_size, 16))
    before = heldout_loss(build_model(t.model_id, tokenizer, t.seed), loader)
    after = heldout_loss(load_pretrained(checkpoint), loader)
    return {
        "eval_loss_before": before,
        "eval_loss_after": after,
        "perplexity_before": math.exp(before),
        "perplexity_after": math.exp(after),
        "num_eval_examples": len(raw),
        "eval_split": t.eval_split,
    }


def main(argv: list[str] | None = None) -> None:
    import ray

    parser = argparse.ArgumentParser(description="Held-out loss before vs after fine-tuning.")
    parser.add_argument("--spec", required=True, help="the run spec, as JSON")
    parser.add_argument("--checkpoint", required=True, help="the fine-tuned checkpoint directory")
    parser.add_argument("--output-dir", required=True, help="the run's training output directory")
    args = parser.parse_args(argv)
    spec = RunSpec.from_json(args.spec)
    out = Path(args.output_dir)
    data_files = None
    if spec.train.dataset == GENERATED_DATASET:
        t = spec.train
        data_files = data.write_generated(out / "data", t.num_train_examples, t.num_eval_examples, t.seed)
    ray.init()
    task = ray.remote(evaluate).options(num_cpus=spec.cluster.cpus_per_host if spec.cluster.accelerator == "cpu"
                                        else 1)
    result = ray.get(task.remote(args.spec, args.checkpoint, data_files, str(out / "data" / ".cache")))
    protocol.emit("result", result)


if __name__ == "__main__":
    main()
