"""MaxText's command line, derived from the run spec, and the spec checks it needs. The llama3-* presets reproduce
the GKE tutorial "Train an LLM such as Llama 3 70B on GKE with MaxText, Ray Train and multislice Trillium TPUs"
(docs/tutorials.md).

Pure data and functions, run where the pipeline runs: the train job's command carries the ``key=value``
arguments (``train_args``) and the MaxText driver (``trainers.maxtext_train``) hands them to
``train.main([prog, <base.yml>, key=value, ...])``. Every override below comes from one spec field. With answers to
the evaluation prompts, the shape MaxText's engine decodes them in (``decode_shape``: the prefill length and the
decode slots, bounded by the KV cache a device can hold beside the parameters) travels on the jobs' command line
too, the plan shows it (``answers_plan``) and the spec checks that one slot fits a chip's HBM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from components.spec import GENERATED_DATASET, RunSpec, SpecError, datasets
from components.tpu import catalogue
from components.tpu.shapes import prefill_length

# Model configs MaxText 0.2.5 ships (maxtext/configs/models/<name>.yml) that tpupipe presets use or that
# users ask for most; any other shipped name can be added here.
MAXTEXT_MODELS = (
    "default",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "llama3.1-8b",
    "llama3.1-70b",
    "llama3.1-405b",
    "llama3.3-70b",
    "mistral-7b",
    "mixtral-8x7b",
    "gemma-2b",
    "gemma-7b",
    "gemma2-2b",
    "gemma2-9b",
    "gemma2-27b",
    "gemma3-4b",
    "gemma3-12b",
    "gemma3-27b",
    "qwen3-0.6b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "deepseek3-tiny",
)

# Models tpupipe defines from MaxText's "default" (Llama-style decoder) with small dimensions: random init,
# nothing to download, trainable on CPU in seconds.
SCRATCH_MODELS: dict[str, dict[str, str]] = {
    "tiny-llama": {
        "model_name": "default",
        "decoder_block": "llama2",
        "base_emb_dim": "64",
        "base_num_query_heads": "4",
        "base_num_kv_heads": "2",
        "base_mlp_dim": "128",
        "base_num_decoder_layers": "2",
        "head_dim": "16",
        "vocab_size": "256",
    },
    # Its checkpoint (86 MB: parameters and AdamW's two moments) is one whose save has bytes to move, where
    # tiny-llama's 1.3 MB is all fixed cost: what the checkpoint bench measures MaxText's asynchronous saves on.
    "small-llama": {
        "model_name": "default",
        "decoder_block": "llama2",
        "base_emb_dim": "512",
        "base_num_query_heads": "8",
        "base_num_kv_heads": "4",
        "base_mlp_dim": "2048",
        "base_num_decoder_layers": "2",
        "head_dim": "64",
        "vocab_size": "256",
    },
}

# Parallelism axes as MaxText names them, and MaxText's base.yml defaults (-1: fill in what is left).
ICI_AXES = ("ici_data_parallelism", "ici_fsdp_parallelism", "ici_tensor_parallelism")
DCN_AXES = ("dcn_data_parallelism", "dcn_fsdp_parallelism")
AXIS_DEFAULTS = {
    "ici_data_parallelism": 1,
    "ici_fsdp_parallelism": -1,
    "ici_tensor_parallelism": 1,
    "dcn_data_parallelism": -1,
    "dcn_fsdp_parallelism": 1,
}

# MaxText's input pipelines tpupipe wires: synthetic (one fixed batch of random tokens, for train and eval alike) and
# hf (MaxText's Hugging Face pipeline on the generated dataset or the run's data snapshot: JSON Lines files and a
# character tokenizer the train and eval jobs write, trainers/maxtext_data.py; its eval reads the held-out split).
DATASET_TYPES = ("synthetic", "hf")
DATA_DIR = "maxtext-data"


def data_paths(output_dir: str) -> dict[str, str]:
    """Where the generated dataset's MaxText files are, under the jobs' output directory (the one both the train
    and the eval job get): the train split, the held-out split (MaxText's eval data) and the tokenizer directory."""
    root = f"{output_dir.rstrip('/')}/{DATA_DIR}"
    return {"train": f"{root}/train.jsonl", "eval": f"{root}/heldout.jsonl", "tokenizer": f"{root}/tokenizer"}


def data_args(spec: RunSpec, output_dir: str) -> list[str]:
    """MaxText's data arguments: the dataset type and, for hf, the files it reads (``hf_path=json`` loads local JSON
    Lines files: maxtext/input_pipeline/hf_data_processing.py in maxtext 0.2.5) and the tokenizer."""
    args = [f"dataset_type={spec.maxtext.dataset_type}"]
    if spec.maxtext.dataset_type == "hf":
        paths = data_paths(output_dir)
        args += [
            "hf_path=json",
            f"hf_train_files={paths['train']}",
            f"hf_eval_files={paths['eval']}",
            f"tokenizer_path={paths['tokenizer']}",
            "tokenizer_type=huggingface",
        ]
    return args


# MaxText logs every parameter of its resolved config on every host as it starts (``log_config``, true by default:
# maxtext/configs/pyconfig.py and configs/types.py in maxtext 0.2.5), about 860 lines per host, in every train and
# evaluation job. The run's config is its spec, printed once, and the arguments above are the job's "MaxText argv"
# line; the rest is the pinned package's base.yml.
QUIET_ARGS = ("log_config=false",)

# Extra arguments when the hosts are emulated on CPU: the driver initialises jax.distributed itself.
CPU_ARGS = (
    "hardware=cpu",
    "skip_jax_distributed_system=true",
    "attention=dot_product",
    "dtype=float32",
    "enable_tensorboard=false",
    "grain_worker_count=0",  # the hf pipeline's loader in the worker's own process: no extra process per host
)


def devices_per_host(spec: RunSpec) -> int:
    """JAX devices each host (Ray Train worker) has: emulated CPU devices, or the slice's logical devices."""
    if spec.cluster.accelerator == "cpu":
        return spec.maxtext.cpu_devices_per_host
    return catalogue.slice_shape(spec.cluster.accelerator, spec.cluster.topology).logical_devices_per_host


def _check_axes(spec: RunSpec, axes: tuple[str, ...], total: int, what: str, when: str = "") -> None:
    values = {axis: getattr(spec.maxtext, axis) for axis in axes}
    auto = [a for a, v in values.items() if v == -1]
    bad = [a for a, v in values.items() if v == 0 or v < -1]
    if bad:
        raise SpecError(f"maxtext.{bad[0]}", f"must be a positive size or -1 (auto), got {values[bad[0]]}")
    if len(auto) > 1:
        raise SpecError(f"maxtext.{auto[1]}", f"only one {what} axis may be -1 (auto): {', '.join(auto)}")
    explicit = math.prod(v for v in values.values() if v != -1)
    product = " x ".join(f"{a.removesuffix('_parallelism')} {v}" for a, v in values.items())
    if (auto and total % explicit) or (not auto and explicit != total):
        field = f"maxtext.{next((a for a, v in values.items() if v not in (1, -1)), axes[0])}"
        hint = [f"one axis -1 (auto), the others dividing {total}"] if when else []
        raise SpecError(field, f"{what} parallelism {product} must multiply to {total}{when}", hint)


def worker_counts(spec: RunSpec) -> list[int]:
    """The Ray Train worker counts (one per host) a run may train with: each whole number of slices from
    ``train.min_workers`` to ``train.max_workers`` when elastic, else every host."""
    t = spec.train
    if not (t.min_workers and t.max_workers):
        return [spec.total_hosts]
    per_slice = spec.cluster.num_hosts
    return list(range(t.min_workers, t.max_workers + 1, per_slice))


def _check_mesh(spec: RunSpec) -> None:
    """MaxText's mesh must fit every worker group the run may have. On TPU the ICI axes span one slice and the DCN
    axes the slices of the group (an elastic group of fewer slices keeps the slices whole). On emulated CPU hosts
    MaxText makes one slice of every device (``max_utils.get_num_slices`` in maxtext 0.2.5: hardware=cpu is one
    slice), so the ICI axes span all the group's devices and the DCN axes multiply to 1; an elastic run needs an
    axis of -1 (auto) for MaxText to fill in on a smaller group."""
    counts = worker_counts(spec)
    elastic = len(counts) > 1
    for workers in counts:
        when = f" on {workers} workers (train.min_workers..train.max_workers)" if elastic else ""
        if spec.cluster.accelerator == "cpu":
            _check_axes(spec, ICI_AXES, devices_per_host(spec) * workers, "ICI (all the devices on CPU)", when)
            _check_axes(spec, DCN_AXES, 1, "DCN (one slice on CPU)")
        else:
            _check_axes(spec, ICI_AXES, devices_per_host(spec) * spec.cluster.num_hosts, "ICI (within a slice)")
            _check_axes(spec, DCN_AXES, workers // spec.cluster.num_hosts, "DCN (across slices)", when)


def validate(spec: RunSpec) -> None:
    """MaxText-specific checks, run by spec.validate for workload=maxtext before anything starts."""
    m = spec.maxtext
    if m.model_name not in MAXTEXT_MODELS and m.model_name not in SCRATCH_MODELS:
        raise SpecError("maxtext.model_name", f"unknown model {m.model_name!r}", [*SCRATCH_MODELS, *MAXTEXT_MODELS])
    if m.steps < 1:
        raise SpecError("maxtext.steps", f"must be at least 1, got {m.steps}")
    if not m.per_device_batch_size > 0:
        raise SpecError("maxtext.per_device_batch_size", f"must be positive, got {m.per_device_batch_size}")
    if m.max_target_length < 8:
        raise SpecError("maxtext.max_target_length", f"must be at least 8, got {m.max_target_length}")
    if m.max_lost_steps < 1:
        raise SpecError("maxtext.max_lost_steps", f"must be at least 1, got {m.max_lost_steps}")
    if m.checkpoint_period < 0:
        raise SpecError(
            "maxtext.checkpoint_period", f"must be 0 (from maxtext.max_lost_steps) or more, got {m.checkpoint_period}"
        )
    if m.checkpoint_period > m.max_lost_steps:
        raise SpecError(
            "maxtext.checkpoint_period",
            f"{m.checkpoint_period} steps between checkpoints would let a preemption repeat more than "
            f"maxtext.max_lost_steps={m.max_lost_steps} steps",
            ["0", f"1 to {m.max_lost_steps}"],
        )
    if m.dataset_type not in DATASET_TYPES:
        raise SpecError("maxtext.dataset_type", f"unknown or unwired dataset type {m.dataset_type!r}", DATASET_TYPES)
    snapshotted = datasets.snapshotted(spec.train.dataset)
    if m.dataset_type == "hf" and spec.train.dataset != GENERATED_DATASET and not snapshotted:
        raise SpecError(
            "train.dataset",
            f"maxtext.dataset_type=hf reads the generated dataset or the run's data snapshot (local files, gs://, "
            f"bq://), got {spec.train.dataset!r}",
            [GENERATED_DATASET, "DIR/", "gs://BUCKET/PREFIX/", "bq://P.D.T"],
        )
    if snapshotted and m.dataset_type != "hf":
        raise SpecError(
            "maxtext.dataset_type",
            f"MaxText reads the run's data snapshot ({spec.train.dataset!r}) through its Hugging Face pipeline, not "
            f"{m.dataset_type!r} data",
            ["hf"],
        )
    if spec.eval.generate_examples and m.dataset_type != "hf":  # trainers.maxtext_generation reads its tokenizer
        raise SpecError(
            "eval.generate_examples",
            f"MaxText answers the evaluation prompts with the tokenizer of its hf data (maxtext.dataset_type=hf); "
            f"maxtext.dataset_type={m.dataset_type} has none",
            ["0", "maxtext.dataset_type=hf"],
        )
    if m.cpu_devices_per_host < 1:
        raise SpecError("maxtext.cpu_devices_per_host", f"must be at least 1, got {m.cpu_devices_per_host}")
    if spec.cluster.accelerator == "cpu" and spec.num_workers != spec.total_hosts:  # an elastic range: checked
        raise SpecError(  # with the TPU catalogue's rules (whole slices, components.workload.checks.check_workers)
            "train.num_workers", f"MaxText runs one worker per host: {spec.total_hosts}, got {spec.num_workers}"
        )
    _check_mesh(spec)
    _check_answers_fit(spec)


# Checkpoints MaxText keeps of a run (``max_num_checkpoints_to_keep``; base.yml leaves it None: every one is kept,
# maxtext/configs/base.yml in maxtext 0.2.5). Two: the newest, and the one before it while the newest is still being
# written in the background (asynchronous checkpointing, MaxText's default ``async_checkpointing: true``), so a host
# lost during a save still finds a complete checkpoint to restore.
CHECKPOINTS_KEPT = 2

# A save on a preemption notice, at the step JAX's preemption sync manager agrees across the processes, after which
# MaxText stops training (base.yml in maxtext 0.2.5: "enables autocheckpoint, which saves a checkpoint at the
# preemption step", off by default). The notice is Ray Train's, handed to JAX by the trainer
# (``trainers.maxtext_train.preemption_notice_to_jax``). Not in the compile job's arguments: it compiles nothing.
AUTOCHECKPOINT = "enable_autocheckpoint=true"

# A parameter's bytes in ``weight_dtype`` (base.yml: ``weight_dtype: "float32"``), as training and MaxText's engine
# hold it. What one MaxText checkpoint holds per parameter: the parameters and AdamW's two moments, each in
# ``weight_dtype`` (base.yml: ``opt_type: "adamw"``, ``mu_dtype: ""``, which "inherits from weight_dtype"): 3 x 4 bytes.
WEIGHT_BYTES = 4
CHECKPOINT_BYTES_PER_PARAMETER = 3 * WEIGHT_BYTES

# The dimensions of the shipped models the presets train (maxtext/configs/models/<name>.yml in maxtext 0.2.5), for
# the parameter count the plan sizes checkpoints by; another model's size is reported unknown.
MODEL_DIMS: dict[str, dict[str, str]] = {
    "llama3-8b": {
        "base_emb_dim": "4096",
        "base_num_query_heads": "32",
        "base_num_kv_heads": "8",
        "base_num_decoder_layers": "32",
        "base_mlp_dim": "14336",
        "head_dim": "128",
        "vocab_size": "128256",
    },
    "llama3-70b": {
        "base_emb_dim": "8192",
        "base_num_query_heads": "64",
        "base_num_kv_heads": "8",
        "base_num_decoder_layers": "80",
        "base_mlp_dim": "28672",
        "head_dim": "128",
        "vocab_size": "128256",
    },
}


def _dims(spec: RunSpec) -> dict[str, str] | None:
    """The spec's model dimensions (``SCRATCH_MODELS``, ``MODEL_DIMS``); None for a model not in either."""
    name = spec.maxtext.model_name
    return SCRATCH_MODELS.get(name) or MODEL_DIMS.get(name)


def parameters(spec: RunSpec) -> int | None:
    """The parameters of the spec's Llama-style decoder (MaxText's ``llama2`` decoder block, which the scratch
    models and the llama3 configs use): token embedding and a separate output projection (``logits_via_embedding:
    false``), per layer the query, key, value and output projections, a gated MLP (``mlp_activations: [silu,
    linear]``: two input matrices and one output) and two RMS norms' scales, and the final norm's; None for a model
    whose dimensions are not in ``MODEL_DIMS``."""
    dims = _dims(spec)
    if not dims:
        return None
    d, layers, mlp = int(dims["base_emb_dim"]), int(dims["base_num_decoder_layers"]), int(dims["base_mlp_dim"])
    q, kv = (
        int(dims["base_num_query_heads"]) * int(dims["head_dim"]),
        int(dims["base_num_kv_heads"]) * int(dims["head_dim"]),
    )
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * mlp + 2 * d
    return 2 * int(dims["vocab_size"]) * d + layers * per_layer + d


def checkpoint_bytes(spec: RunSpec) -> int | None:
    """One checkpoint's size (parameters and optimizer state); None when the model's size is unknown."""
    params = parameters(spec)
    return None if params is None else params * CHECKPOINT_BYTES_PER_PARAMETER


def checkpoint_period(spec: RunSpec) -> int:
    """Steps between MaxText's checkpoints: ``maxtext.checkpoint_period``, else ``maxtext.max_lost_steps`` (a run
    restored from its newest checkpoint repeats at most that many steps), at most the run's steps."""
    m = spec.maxtext
    return min(m.checkpoint_period or m.max_lost_steps, m.steps)


# --- Answers to the evaluation prompts (trainers.maxtext_generation): MaxText's decode slots and KV cache ---------


def decode_prefill(spec: RunSpec) -> int:
    """The largest prefill a job may pad a prompt to: the bucket of the longest prompt there may be (prompts are cut
    to ``maxtext.max_target_length`` tokens, trainers.maxtext_generation), the plan's worst case. A job prefills at
    the bucket of its longest real prompt, at most this; the train and the evaluation job read the same prompts, so
    both compile the same prefill, once."""
    return prefill_length(spec.maxtext.max_target_length)


# MaxText's KV cache (maxtext 0.2.5, maxtext/inference/kvcache.py, ``KVCache``): in the decode state each decoder
# layer holds, per decode slot, a prefill part of ``max_prefill_predict_length`` tokens and an autoregressive part of
# ``max_target_length`` - that, so a slot caches ``max_target_length`` tokens (trainers.maxtext_generation sets it to
# the prefill and the new tokens); per token a key and a value of ``base_num_kv_heads`` x ``head_dim`` in the compute
# ``dtype`` (base.yml's bfloat16; CPU_ARGS' on CPU hosts) and an int32 segment id. Sharded by base.yml's
# ``logical_axis_rules``: ``cache_batch``, ``cache_sequence`` and ``cache_kv`` on no mesh axis (every device holds
# every slot and token), ``cache_heads`` across ``autoregressive``, ``tensor`` and ``tensor_sequence``, of which
# tpupipe sets ``tensor`` alone (``ici_tensor_parallelism``). Left out: the decode state's logits (slots x vocabulary,
# float32) and each prefill's own batch-1 cache, small beside it; and the padding of a TPU's tiled layout, unmeasured:
# the caches are laid out sequence, heads, slots, head_dim (base.yml's ``ar_cache_axis_order`` and
# ``prefill_cache_axis_order``, "1,2,0,3"), the slots second-minor, which XLA's bfloat16 tiles may pad to a multiple
# of 16 (37 slots taking 48's bytes); a TPU run's answers log the bytes in use on device 0 at their end
# (trainers.maxtext_generation) to measure it by. The engine holds one decode state at a time (it serves every group
# of prompts), so the budget is one cache's; a load holds two copies of the parameters for a moment (MaxText builds a
# concrete model before it reshards or restores into it), under training's own footprint (the parameters and the
# optimizer's moments), before the KV cache exists.
BASE_DTYPE = "bfloat16"
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
SEGMENT_ID_BYTES = 4

# The KV cache's budget: this share of a device's HBM left beside the parameters, the rest for a prefill's
# activations, the decode state and XLA's buffers. A choice of tpupipe's, not a measured figure.
KV_CACHE_SHARE = 0.5


def _compute_dtype(spec: RunSpec) -> str:
    if spec.cluster.accelerator == "cpu":
        return dict(a.split("=", 1) for a in CPU_ARGS)["dtype"]
    return BASE_DTYPE


def group_axes(spec: RunSpec, devices: int) -> dict[str, int]:
    """Each parallelism axis's size on a worker group of ``devices`` devices, an axis of -1 given what the others
    leave: the ICI axes span a slice's devices (all the group's on CPU hosts), the DCN axes the group's slices
    (:func:`_check_mesh`)."""
    per_host = devices_per_host(spec)
    if spec.cluster.accelerator == "cpu":
        totals = (devices, 1)
    else:
        per_slice = per_host * spec.cluster.num_hosts
        totals = (per_slice, max(1, devices // per_slice))
    sizes: dict[str, int] = {}
    for axes, total in zip((ICI_AXES, DCN_AXES), totals, strict=True):
        values = {axis: getattr(spec.maxtext, axis) for axis in axes}
        explicit = math.prod(v for v in values.values() if v != -1)
        sizes |= {axis: total // explicit if v == -1 else v for axis, v in values.items()}
    return sizes


@dataclass(frozen=True)
class DecodeMemory:
    """What one device holds while MaxText's engine answers, in bytes: the parameters (None: the model's size is
    unknown) and one decode slot's KV cache (None: its dimensions are), and the device's HBM (None: CPU hosts)."""

    parameters: int | None
    kv_cache_per_slot: int | None
    hbm: int | None

    def slots_fitting(self) -> int | None:
        """The most slots whose KV cache fits its budget (:data:`KV_CACHE_SHARE` of the HBM left beside the
        parameters); None when a figure is unknown."""
        if self.parameters is None or self.kv_cache_per_slot is None or self.hbm is None:
            return None
        return int((self.hbm - self.parameters) * KV_CACHE_SHARE) // self.kv_cache_per_slot


def decode_memory(spec: RunSpec, devices: int, cache_tokens: int) -> DecodeMemory:
    """A device's share of the parameters and of one slot's KV cache of ``cache_tokens`` tokens on a group of
    ``devices`` devices. The engine shards the parameters as training does: no weight's logical axis maps to a
    ``data`` axis in base.yml's ``logical_axis_rules`` (``embed`` to fsdp, ``mlp`` and the heads to tensor, ...), so
    each data replica (``ici_data_parallelism`` x ``dcn_data_parallelism``) holds them whole, split over its
    devices; the KV cache as the comment above says."""
    axes = group_axes(spec, devices)
    count, dims = parameters(spec), _dims(spec)
    shards = devices // (axes["ici_data_parallelism"] * axes["dcn_data_parallelism"])
    kv = None
    if dims:
        heads = math.ceil(int(dims["base_num_kv_heads"]) / axes["ici_tensor_parallelism"])
        per_token = 2 * heads * int(dims["head_dim"]) * DTYPE_BYTES[_compute_dtype(spec)] + SEGMENT_ID_BYTES
        kv = int(dims["base_num_decoder_layers"]) * cache_tokens * per_token
    hbm = None
    if spec.cluster.accelerator != "cpu":
        hbm = catalogue.family(spec.cluster.accelerator).hbm_bytes_per_device
    return DecodeMemory(None if count is None else math.ceil(count * WEIGHT_BYTES / shards), kv, hbm)


def training_batch(spec: RunSpec, devices: int) -> int:
    """MaxText's training batch on ``devices`` devices (``per_device_batch_size`` x devices, rounded down: its
    ``micro_batch_size_to_train_on``, maxtext/configs/types.py)."""
    return int(devices * spec.maxtext.per_device_batch_size)


def decode_slots(spec: RunSpec, devices: int, prompts: int, cache_tokens: int) -> int:
    """The decode slots MaxText's engine answers ``prompts`` prompts in, on ``devices`` devices: the training batch
    (the decode batch MaxText's decode.py uses), at most the prompts, and no more than fit the KV cache's budget
    (:meth:`DecodeMemory.slots_fitting`); at least one."""
    slots = min(training_batch(spec, devices), prompts)
    fitting = decode_memory(spec, devices, cache_tokens).slots_fitting()
    return max(1, slots if fitting is None else min(slots, fitting))


def group_devices(spec: RunSpec) -> list[int]:
    """The devices of each worker group the run may have (:func:`worker_counts`)."""
    return [devices_per_host(spec) * workers for workers in worker_counts(spec)]


def decode_shape(spec: RunSpec) -> dict[str, Any] | None:
    """The shape MaxText's engine answers in (trainers.maxtext_generation), which the MaxText jobs get on their
    command line (``derive.job_command``): the largest prefill (:func:`decode_prefill`) and the decode slots on each
    group the run may have, by its devices (:func:`decode_slots`, a slot caching that prefill and
    ``eval.max_new_tokens``: the worst case, so the slots fit with room the cache of the prefill the job uses, the
    bucket of its longest prompt); None without answers."""
    n = spec.eval.generate_examples
    if not n:
        return None
    prefill = decode_prefill(spec)
    tokens = prefill + spec.eval.max_new_tokens
    return {"prefill": prefill, "slots": {str(d): decode_slots(spec, d, n, tokens) for d in group_devices(spec)}}


def answers_plan(spec: RunSpec) -> dict[str, Any] | None:
    """The train job's answers to the evaluation prompts as the plan shows them, on the whole group (every host):
    the prompts, the decode slots (:func:`decode_shape`), a slot's cached tokens and, per chip, the KV cache's
    bytes, the parameters' and the HBM (None: unknown); None without answers."""
    shape = decode_shape(spec)
    if not shape:
        return None
    devices = max(group_devices(spec))
    tokens = shape["prefill"] + spec.eval.max_new_tokens
    memory = decode_memory(spec, devices, tokens)
    slots = shape["slots"][str(devices)]
    per_chip = (
        1 if spec.cluster.accelerator == "cpu" else catalogue.family(spec.cluster.accelerator).logical_devices_per_chip
    )

    def chip(value: int | None) -> int | None:
        return None if value is None else value * per_chip

    kv = None if memory.kv_cache_per_slot is None else memory.kv_cache_per_slot * slots
    return {
        "prompts": spec.eval.generate_examples,
        "slots": slots,
        "training_batch": training_batch(spec, devices),
        "cache_tokens": tokens,
        "kv_cache_bytes_per_chip": chip(kv),
        "parameter_bytes_per_chip": chip(memory.parameters),
        "hbm_bytes_per_chip": chip(memory.hbm),
    }


def _check_answers_fit(spec: RunSpec) -> None:
    """With answers on a slice, one decode slot's KV cache must fit its budget (:data:`KV_CACHE_SHARE` of a device's
    HBM left beside the parameters) on every group the run may have: the hardest is the smallest, whose devices hold
    the most of the parameters, where :func:`decode_slots` would still answer in one slot."""
    if not spec.eval.generate_examples or spec.cluster.accelerator == "cpu":
        return
    prefill = decode_prefill(spec)
    tokens = prefill + spec.eval.max_new_tokens
    memory = decode_memory(spec, min(group_devices(spec)), tokens)
    if memory.parameters is None or memory.kv_cache_per_slot is None or memory.hbm is None:
        return
    if memory.parameters > memory.hbm or memory.slots_fitting():  # the parameters alone: training's to refuse
        return
    budget = int((memory.hbm - memory.parameters) * KV_CACHE_SHARE)
    raise SpecError(
        "eval.max_new_tokens",
        f"one decode slot's KV cache, {memory.kv_cache_per_slot / 1e9:,.1f} GB a device for {tokens:,} tokens "
        f"(prompts cut to maxtext.max_target_length={spec.maxtext.max_target_length} in a prefill of "
        f"{prefill:,}, then eval.max_new_tokens={spec.eval.max_new_tokens}), does not fit its budget of "
        f"{budget / 1e9:,.1f} GB, {KV_CACHE_SHARE:.0%} of what the parameters' {memory.parameters / 1e9:,.1f} GB "
        f"leave of a {spec.cluster.accelerator} device's {memory.hbm / 1e9:,.1f} GB of HBM, on a worker group of "
        f"{min(group_devices(spec))} devices, the smallest the run may have",
        ["a smaller eval.max_new_tokens", "a smaller maxtext.max_target_length", "eval.generate_examples=0"],
    )


def _fmt(value: float) -> str:
    return f"{value:g}"


def train_args(spec: RunSpec, output_dir: str, run_name: str, compile_cache: str = "") -> list[str]:
    """The ``key=value`` arguments MaxText's ``train.main`` gets after its base config for this spec (the MaxText
    tutorial's commands, for the llama3-* presets). ``compile_cache``: the directory of JAX's persistent compilation
    cache shared across runs (``components.workload.cache``), MaxText's ``jax_cache_dir`` (MaxText hands it to
    ``jax.experimental.compilation_cache.set_cache_dir``: maxtext/configs/pyconfig.py; its default, ``~/jax_cache``,
    dies with the pod)."""
    m = spec.maxtext
    args = [
        *data_args(spec, output_dir),
        f"per_device_batch_size={_fmt(m.per_device_batch_size)}",
        f"max_target_length={m.max_target_length}",
    ]
    if m.model_name in SCRATCH_MODELS:
        args += [f"{k}={v}" for k, v in SCRATCH_MODELS[m.model_name].items()]
    else:
        args.append(f"model_name={m.model_name}")
    args.append(f"steps={m.steps}")
    args += [f"{axis}={getattr(m, axis)}" for axis in ICI_AXES + DCN_AXES if getattr(m, axis) != AXIS_DEFAULTS[axis]]
    if m.remat_policy:
        args.append(f"remat_policy={m.remat_policy}")
    if m.learning_rate:
        args.append(f"learning_rate={_fmt(m.learning_rate)}")
    args += [f"checkpoint_period={checkpoint_period(spec)}", f"max_num_checkpoints_to_keep={CHECKPOINTS_KEPT}"]
    args.append(AUTOCHECKPOINT)
    if compile_cache:
        args.append(f"jax_cache_dir={compile_cache}")
    args += [f"base_output_directory={output_dir}", f"run_name={run_name}", *QUIET_ARGS]
    if spec.cluster.accelerator == "cpu":
        args += CPU_ARGS
    return args


# The compile job's steps: MaxText compiles its train step (and what it runs around it) on the first step.
COMPILE_STEPS = 1


def compile_args(spec: RunSpec, output_dir: str, run_name: str, compile_cache: str) -> list[str]:
    """MaxText's arguments for the run's compile job (``components.stages.compile_cache``): the train job's, with
    MaxText's synthetic data in place of the run's files (``dataset_type=synthetic``: batches of the configured
    shapes made in the process, no dataset or tokenizer read), a model built from the config (no
    ``load_parameters_path``: nothing the run loads), no checkpoints, and ``COMPILE_STEPS`` steps over the train
    job's learning-rate schedule (``learning_rate_schedule_steps``: base.yml in maxtext 0.2.5, "you may choose a
    longer schedule ..., in which case the training will end before"), so the programs it compiles are the train
    job's and JAX's cache keys them alike."""
    data = set(data_args(spec, output_dir))
    kept = [
        a
        for a in train_args(spec, output_dir, run_name, compile_cache)
        if a not in data
        and a != AUTOCHECKPOINT
        and not a.startswith(("steps=", "checkpoint_period=", "max_num_checkpoints_to_keep="))
    ]
    schedule = [f"steps={COMPILE_STEPS}", f"learning_rate_schedule_steps={spec.maxtext.steps}"]
    return ["dataset_type=synthetic", *kept, *schedule, "enable_checkpointing=false"]


def compile_config(spec: RunSpec, devices: int) -> str:
    """What the compile job compiles, as one digest: its MaxText arguments without the per-run paths, and the number
    of devices it compiles for (``devices``, ``derive.compile_devices``: an elastic run's group size changes its
    programs). The trusted manifest names the configurations already compiled, so a recurring run submits no
    compile job."""
    import hashlib

    args = [a for a in compile_args(spec, "", "", "") if not a.startswith(("base_output_directory=", "run_name="))]
    args.append(f"devices={devices}")
    return "sha256:" + hashlib.sha256("\n".join(args).encode()).hexdigest()
