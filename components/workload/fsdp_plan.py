"""The FSDP trainer's part of the plan: what its checkpoints cost in the run's storage (``trainers.checkpoints``: a
sharded resume point holds the trained weights, the frozen per-layer embedding table left out, and, with
``train.checkpoint_optimizer``, AdamW's two moments of each; the trained model written once at the end holds the
weights alone), how they are written (``train.checkpoint_staging``), and whether TorchTPU's compile cache is on, with
the setting that turns it on. Pure data and arithmetic: no torch, no hub."""

from __future__ import annotations

from typing import Any

from components.spec import RunSpec

# Parameters the FSDP trainer trains and checkpoints, by hub model id, at most: Gemma 4 E2B has 5.1B parameters with
# its per-layer embeddings (the model card, https://huggingface.co/google/gemma-4-E2B-it), less the frozen per-layer
# table the trainer leaves out of every checkpoint, 262,144 tokens x 35 layers x 256 = 2,348,810,240 (its config's
# vocab_size_per_layer_input, num_hidden_layers and hidden_size_per_layer_input:
# https://huggingface.co/google/gemma-4-E2B-it/blob/main/config.json). An upper bound: the 5.1B also counts the
# vision and audio encoders, which the trainer does not load. Another model's size is reported unknown.
TRAINED_PARAMETERS = {"google/gemma-4-E2B-it": 5_100_000_000 - 262_144 * 35 * 256}

# AdamW keeps two moments per parameter (exp_avg, exp_avg_sq), each in the parameter's dtype
# (https://docs.pytorch.org/docs/stable/generated/torch.optim.AdamW.html; torch/optim/adamw.py's state).
ADAMW_MOMENTS = 2


def weight_bytes(spec: RunSpec) -> int:
    """Bytes per trained weight as checkpointed: the dtype the weights are kept in on a TPU (``trainers.mesh.dtypes``:
    float32, or bfloat16 with ``train.precision=bf16``)."""
    return 2 if spec.train.precision == "bf16" else 4


# What the plan says of a setting that is off until a TPU run proves it, and how to turn it on.
TORCH_TPU_CACHE_OFF = (
    "off: TorchTPU's persistent (tier-3) compile cache has not run on a TPU; each worker group compiles its programs "
    "again. Turn it on with --set train.torch_tpu_compile_cache=true (kept in the run's cache directory)"
)
TORCH_TPU_CACHE_ON = "on (train.torch_tpu_compile_cache=true): TorchTPU's executables kept in the run's cache directory"
STAGING_WORDS = {
    "auto": "sync on the TPU (DCP's asynchronous staging has not run on one; train.checkpoint_staging=async turns it "
    "on), async on the CPU",
    "async": "async: copied to host memory, then written while training goes on (train.checkpoint_staging=async)",
    "sync": "sync: each written before training goes on (train.checkpoint_staging=sync)",
}


def plan_entry(spec: RunSpec) -> dict[str, Any]:
    """The plan's ``fsdp_checkpoints`` of an FSDP run: the steps between sharded saves, how many Ray Train keeps,
    whether they hold the optimizer state, how they are written (``staging``, in words), the trained parameters (None:
    unknown) and the bytes of one sharded save, of those kept, and of the trained model; and its ``torch_tpu_cache``:
    on or off, in words that say how to turn it on."""
    t = spec.train
    params = TRAINED_PARAMETERS.get(t.model_id)
    per_param = weight_bytes(spec) * (1 + (ADAMW_MOMENTS if t.checkpoint_optimizer else 0))
    each = None if params is None else params * per_param
    return {
        "fsdp_checkpoints": {
            "every_steps": t.checkpoint_every_steps or None,
            "kept": t.num_to_keep,
            "optimizer": t.checkpoint_optimizer,
            "trained_parameters_at_most": params,
            "bytes_each": each,
            "bytes_kept": None if each is None or not t.num_to_keep else each * t.num_to_keep,
            "final_bytes": None if params is None else params * weight_bytes(spec),
            "staging": STAGING_WORDS[t.checkpoint_staging],
        },
        "torch_tpu_cache": {
            "enabled": t.torch_tpu_compile_cache,
            "what": TORCH_TPU_CACHE_ON if t.torch_tpu_compile_cache else TORCH_TPU_CACHE_OFF,
        },
    }


def plan_lines(training: dict[str, Any]) -> list[str]:
    """The plan's text lines of :func:`plan_entry`'s entries in the plan's ``training``; none for another trainer."""
    entry, cache = training.get("fsdp_checkpoints"), training.get("torch_tpu_cache")
    if not entry or not cache:
        return []

    def gb(n: int | None) -> str:
        return "unknown size" if n is None else f"{n / 1e9:,.1f} GB"

    when = f"every {entry['every_steps']} steps and " if entry["every_steps"] else ""
    held = "weights and AdamW's two moments" if entry["optimizer"] else "weights (train.checkpoint_optimizer=false)"
    return [
        f"  checkpoints sharded, {when}at each epoch's end and on a preemption notice: {gb(entry['bytes_each'])} "
        f"each at most ({held}), the newest {entry['kept']} kept: {gb(entry['bytes_kept'])}",
        f"  final       the trained model, written once into the run's storage: {gb(entry['final_bytes'])} at most",
        f"  staging     {entry['staging']}",
        f"  torch_tpu   compile cache {cache['what']}",
    ]
