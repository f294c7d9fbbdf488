"""An FSDP2 fine-tune written by hand for torchrun: the baseline ``bench/bench_trainer.py`` holds the pipeline's
train stage to.

``python -m torch.distributed.run --standalone --nproc_per_node=N bench/fsdp_by_hand.py --data-dir DIR ...`` runs in
the torch environment. The model and the data come from the project's own builders (``trainers.model``,
``trainers.data``) so both sides train the same weights on the same tokens, and its step is the trainer's
(``trainers.mesh.train_step``: the loss a mean over every rank's labelled tokens, their count all-reduced each step, as
transformers' Trainer computes it), so both compute the same losses; everything else (the process group,
``fully_shard``, the optimizer, the loop, the timing) is the plain loop a user writes for torchrun. Rank 0 prints one
``by-hand {json}`` line per epoch: epoch, loss, seconds, tokens/s, counted as ``trainers/fsdp.py`` counts them (every
rank's padded tokens over the epoch's wall time, the epoch-end loss all-reduce included).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from trainers import data
from trainers.mesh import train_step
from trainers.model import build_model, decoder_layers, frozen_params, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description="FSDP2 fine-tune by hand, under torchrun, on CPU with gloo.")
    parser.add_argument("--data-dir", required=True, help="the generated train.jsonl (and the datasets cache)")
    parser.add_argument("--model-id", default="scratch:gemma4-tiny")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    tokenizer = load_tokenizer(args.model_id)
    files = {"train": f"{args.data_dir}/train.jsonl"}
    dataset = data.tokenize(data.load_split("generated", "train", files), tokenizer, args.max_length)
    sampler = DistributedSampler(dataset, shuffle=True)
    # The tokenised split gives a batch whole (``trainers.data.Tokenized``): nothing to collate.
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True, collate_fn=lambda b: b)

    model = build_model(args.model_id, tokenizer, args.seed, torch.float32)
    frozen = frozen_params(model)
    for param in frozen:
        param.requires_grad_(False)
    mesh = init_device_mesh("cpu", (world,))
    for layer in decoder_layers(model):
        fully_shard(layer.mlp, mesh=mesh)
    fully_shard(model, mesh=mesh, ignored_params=frozen or None)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=args.weight_decay
    )

    cpu = torch.device("cpu")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        started = time.perf_counter()
        loss_sum = torch.zeros(())
        for batch in loader:
            loss_sum += train_step(model, optimizer, batch, cpu)
        dist.all_reduce(loss_sum)
        loss = loss_sum.item() / len(loader) / world
        seconds = time.perf_counter() - started
        tokens = len(loader) * args.batch_size * world * args.max_length
        if rank == 0:
            print(
                "by-hand "
                + json.dumps({"epoch": epoch + 1, "loss": loss, "epoch_s": seconds, "tokens_per_s": tokens / seconds}),
                flush=True,
            )
    # Every rank done with the group before any tears it down: a rank whose peer tore down first sometimes aborted
    # at exit in gloo's teardown ("terminate called without an active exception", SIGABRT).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
