"""The FSDP2 trainer's checkpoints (``trainers.fsdp``): the trained state gathered to rank 0 and written with the
config and the tokenizer, and restored into a sharded model (and its optimizer) when Ray Train restarts the worker
group. Weights are safetensors and the optimizer state is read with ``weights_only=True``: loading a checkpoint runs
no code planted in its directory. Imports torch and safetensors only inside the functions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CHECKPOINT_META = "tpupipe_checkpoint.json"


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
