"""The FSDP2 trainer's code path on one GPU: tokens/s and MFU of a ~1B-parameter Gemma-style model in bf16.

Run by hand on a machine with a GPU, in the torch environment (``.envs/torch-*/bin/python -m bench.gpu_fsdp --out
gpu_fsdp.json``). One process, no Ray: the model is built by ``trainers.model.build_model`` and sharded by
``trainers.mesh.parallelize`` (bf16 parameters, fp32 gradient reduction, ``fully_shard`` on each MLP and the root)
over a one-device mesh, and each step is the train loop's (forward, backward, AdamW step, gradients cleared, the loss
kept on the device). The data is random token ids: the figure is the model's speed, not the input pipeline's.

FLOPs per token = 6 x parameters (the tied embedding counted once: its matmul as the output layer) + 12 x layers x
attention width (heads x head dim) x sequence length, every layer counted at full causal length (the convention
of the PaLM paper's MFU). MFU = tokens/s x FLOPs per token / the chip's peak dense bf16 FLOP/s, from PEAK_BF16 by
the device's name, or ``--peak-tflops``.

``--tiny`` runs a few-million-parameter config for a few steps, on CPU where there is no GPU (fp32 there, as the
trainer computes on CPU), to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench.figures import Figure, table

REPO = Path(__file__).resolve().parents[1]

# torch would load every installed device backend on import, torch_tpu too (the torch image has it): without chips,
# and outside a torchrun- or Ray-started process, its first use waits minutes on the TPU metadata server. This
# script measures a GPU, so it loads none (trainers.devices.detect_backend imports torch_tpu itself where there are
# chips).
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

# google/gemma-3-1b-pt's text dimensions (26 layers, 5 sliding-window layers to 1 global, one KV head, Gemma's
# 262,144-token vocabulary, tied embeddings): ~1.0B parameters. Built with the trainer's model family (Gemma 4's
# decoder) without per-layer inputs (hidden_size_per_layer_input 0), so every parameter trains as in a dense model.
GEMMA_1B = {
    "vocab_size": 262_144,
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "global_head_dim": 256,
    "hidden_size_per_layer_input": 0,
    "sliding_window": 512,
    "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(25)]
    + ["full_attention"],
    "max_position_embeddings": 32_768,
}
# A few million parameters, the same shape of model: for checking the script on CPU.
TINY = {
    "vocab_size": 8192,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "global_head_dim": 64,
    "hidden_size_per_layer_input": 0,
    "sliding_window": 64,
    "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    "max_position_embeddings": 512,
}

# Peak dense bf16 FLOP/s (no sparsity) by device name, from the vendors' data sheets; the first match wins.
PEAK_BF16 = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM
    ("H200", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
)

SCRATCH_NAME = "bench-gpu-fsdp"


class Vocabulary:
    """What ``build_model`` reads of a tokenizer (its size and special ids), for a model without one: Gemma's ids
    (pad 0, eos 1, bos 2) over ``size`` tokens."""

    pad_token_id, eos_token_id, bos_token_id = 0, 1, 2

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def peak_flops(device_name: str) -> float | None:
    for key, peak in PEAK_BF16:
        if key.lower() in device_name.lower():
            return peak
    return None


def flops_per_token(params: int, config: dict, seq: int) -> float:
    width = config["num_attention_heads"] * config["head_dim"]
    return 6 * params + 12 * config["num_hidden_layers"] * width * seq


def build(config: dict, device, device_type: str, seed: int):
    """The model as the trainer builds and shards it, and its AdamW (the trainer's optimizer)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from components.spec import models as model_configs
    from trainers.mesh import parallelize
    from trainers.model import build_model

    if not dist.is_initialized():
        backend = {"cuda": "nccl", "cpu": "gloo"}[device_type]
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    # build_model takes scratch configs by name: this one is registered for the process only.
    model_configs.SCRATCH_CONFIGS[SCRATCH_NAME] = {
        "family": "gemma4",
        "config": {k: v for k, v in config.items() if k != "vocab_size"},
    }
    dtype = torch.float32 if device_type == "cpu" else torch.bfloat16
    model = build_model(f"scratch:{SCRATCH_NAME}", Vocabulary(config["vocab_size"]), seed, dtype)
    params = sum(p.numel() for p in model.parameters())  # unique parameters: the tied embedding once
    compute = None if device_type == "cpu" else "bfloat16"  # bf16 parameters (built so above), fp32 reduction
    model = parallelize(model.to(device), init_device_mesh(device_type, (1,)), compute)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.01)
    return model, optimizer, params


def measure(
    tiny: bool = False,
    batch_size: int | None = None,
    seq: int | None = None,
    steps: int | None = None,
    warmup: int | None = None,
    peak_tflops: float | None = None,
    seed: int = 0,
) -> dict:
    """Train ``warmup`` steps, then time ``steps`` more; returns the figures as a dict."""
    import torch

    from trainers.devices import detect_backend

    device_type, _ = detect_backend()
    if device_type not in ("cuda", "cpu"):
        raise SystemExit(f"this script measures a GPU (or checks itself on CPU), not {device_type}")
    config = TINY if tiny else GEMMA_1B
    batch_size = batch_size or (4 if tiny else 8)
    seq = seq or (128 if tiny else 2048)
    steps = steps or (4 if tiny else 20)
    warmup = warmup if warmup is not None else (1 if tiny else 3)
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if device_type == "cuda" else "cpu"
    model, optimizer, params = build(config, device, device_type, seed)
    generator = torch.Generator().manual_seed(seed)
    batches = [
        torch.randint(3, config["vocab_size"], (batch_size, seq), generator=generator).to(device) for _ in range(2)
    ]

    def sync() -> None:
        if device_type == "cuda":
            torch.cuda.synchronize()

    model.train()
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    started = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            sync()
            started = time.perf_counter()
        ids = batches[step % len(batches)]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach().float()
    sync()
    seconds = time.perf_counter() - started
    tokens_per_s = steps * batch_size * seq / seconds
    per_token = flops_per_token(params, config, seq)
    peak = peak_tflops * 1e12 if peak_tflops else peak_flops(name) if device_type == "cuda" else None
    return {
        "device": name,
        "config": "tiny" if tiny else "gemma-3-1b dimensions",
        "parameters": params,
        "dtype": "float32" if device_type == "cpu" else "bfloat16",
        "batch_size": batch_size,
        "seq_len": seq,
        "steps_timed": steps,
        "warmup_steps": warmup,
        "seconds": seconds,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": per_token,
        "achieved_tflops": tokens_per_s * per_token / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu": tokens_per_s * per_token / peak if peak else None,
        "mean_loss": loss_sum.item() / (warmup + steps),
        "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if device_type == "cuda" else None,
    }


def figures(**kwargs) -> list[Figure]:
    """:func:`measure`'s figures, for ``bench.figures.table`` (no targets: a chip's figures are reported as they
    are)."""
    return as_figures(measure(**kwargs))


def as_figures(result: dict) -> list[Figure]:
    detail = {k: v for k, v in result.items() if k not in ("tokens_per_s", "mfu")}
    out = [Figure(f"FSDP2 on one {result['device']}: tokens/s", result["tokens_per_s"], "tokens/s", None, detail)]
    if result["mfu"] is not None:
        out.append(Figure(f"FSDP2 on one {result['device']}: MFU", result["mfu"], "x", None, detail))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="Tokens/s and MFU of the FSDP2 trainer's code path on one GPU.")
    parser.add_argument("--tiny", action="store_true", help="a few-million-parameter model, a few steps (CPU check)")
    parser.add_argument("--batch-size", type=int, help="sequences per step (default 8; tiny 4)")
    parser.add_argument("--seq", type=int, help="tokens per sequence (default 2048; tiny 128)")
    parser.add_argument("--steps", type=int, help="timed steps (default 20; tiny 4)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 3; tiny 1)")
    parser.add_argument("--peak-tflops", type=float, help="the chip's peak dense bf16 TFLOP/s, if not in the table")
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()
    result = measure(args.tiny, args.batch_size, args.seq, args.steps, args.warmup, args.peak_tflops)
    for key, value in result.items():
        print(f"{key:16} {value:,.4g}" if isinstance(value, float) else f"{key:16} {value}")
    print()
    print(table(as_figures(result)))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
