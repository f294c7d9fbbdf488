"""Answers to the evaluation prompts by greedy decoding with MaxText's own inference engine, in the MaxText job that
holds the model: the trained model's after training (its last checkpoint, the one the run registers), the model
training started from (:data:`INITIAL`), and in the evaluation job a champion's. Scored and written as the FSDP
trainer's (``trainers.generation.record``), so the evaluate stage reads both alike (``components.stages.answers``).

The engine is ``MaxEngine`` (maxtext 0.2.5, ``maxtext/inference/maxengine/maxengine.py``), driven as MaxText's own
``maxtext/inference/decode.py`` drives it: ``load_params``, then per prompt ``prefill`` into a decode slot and
``insert`` into the decode state, then ``generate`` steps that advance every slot by one token. Its decode state is a
KV cache of static shape (slots x ``max_target_length``), and every prompt is right-padded to one prefill length
(``max_prefill_predict_length``), with its true length a traced argument of the jitted prefill (``_prefill_jit``
marks no length static), so on a TPU prefill, insert and generate each compile once. Greedy: base.yml's
``decode_sampling_strategy`` default, set here explicitly. A prompt longer than training's ``max_target_length``
keeps its beginning token and its last tokens.

The shape: the job's command line carries the plan's (``--decode``: ``components.workload.maxtext.decode_shape``,
which the plan shows and the spec checks against the chip's HBM): the largest prefill, the bucket of a prompt of
``max_target_length`` tokens (the smallest power of two >= 64 that holds it: the bucket sizes MaxText's inference
benchmarks prefill at), and the decode slots (MaxEngine's decode batch, ``per_device_batch_size`` x the group's
devices, as decode.py's ``batch_size``) of each group size the run may have: the training batch, at most the
prompts, and no more than the KV cache's budget holds on a TPU with that largest prefill. The job prefills at the
bucket of its longest prompt, at most that largest; the train and the evaluation job read the same prompts, so both
compile the same prefill, and the plan's slots, worked out for the worst case, fit the smaller cache with room. The
prompts go in groups of that many slots through one decode state, made once: ``insert`` and ``generate`` donate it
(``_insert_jit``, ``_generate_jit``), and ``insert`` overwrites all a slot's next prompt reads (its prefill cache,
position, token and logits) and masks out the slot's autoregressive cache (``_insert_jit`` zeroes its
``cache_ar_segment_id``; the autoregressive part is a ring every slot writes at one index,
``maxtext/inference/kvcache.py``, ``kv_cache_autoregressive``, so a group's ``max_new_tokens`` - 1 steps never
overwrite its own entries); a short last group's unused slots go on decoding the group before's prompts, read by no
one (each slot attends to its own cache only). The state is made in a jit (:func:`answer` says why: MaxEngine would
also keep a whole unsharded cache on the first device). Never two KV caches at once, then: the budget is the cache's.

The parameters: a checkpoint's ``items`` (``load_parameters_path``: ``load_params`` reads it), or, for the model
training starts from, the training arguments' ``load_parameters_path`` when they carry one (a base checkpoint:
MaxText's training loads its parameters, ``maxtext_utils.setup_initial_state``), else what training's own program
initialises (:func:`initial_params`), handed to ``load_params(params=...)``, which reshards them onto the engine's
mesh. Those are made and answered with at the start of a worker group that restores no checkpoint of the run, in the
processes and on the mesh that train next, before ``train.main`` (``trainers.maxtext_train``): on a TPU the
``unsafe_rbg`` PRNG that MaxText's training sets (``maxtext/trainers/pre_train/train.py``, ``initialize``, with
``--xla_tpu_spmd_rng_bit_generator_unsafe``) draws bits that depend on the program and its sharding (jax 0.12,
``jax/random.py``'s table: not "identical across shardings" with that flag), so only training's own initialisation on
training's own mesh gives training's parameters; after training, or on a group of another size (an elastic shrink, a
restore), any other program could give others. A group that restarts before a checkpoint initialises again and
answers again (the evaluate stage reads each model's last answers), so the answers are those of the initialisation
training went on from. The engine's own initialisation would not do either: without a checkpoint, ``load_params``
builds its model in autoregressive mode, whose RNG is the seed's key itself where training's is the seed's key
folded with 0 (``maxtext_utils_nnx.create_nnx_rngs``), and it ignores its ``rng`` argument.

Memory: a load holds two copies of the parameters for a moment, MaxText's own: ``_load_params_nnx`` builds a
concrete model before it reshards the given parameters (``maxengine.py``, ``create_nnx_sharded_model``), and
``model_creation_utils.from_pretrained`` initialises one before it restores a checkpoint into it; the first load
comes before training holds anything, the last after ``train.main`` returned its state, and two copies are less than
training's own parameters and optimizer moments. The KV cache comes after, one at a time.

Every worker runs the same calls on the group's one mesh (a collective); the tokens stay on the devices until a
group ends, then meet on every device in one replicating copy (a jitted identity whose output sharding is the
engine's replicated one), which each host reads locally. Every model's tokens are made first, by every worker; then
rank 0 alone decodes, scores and records them (a team's scorer may be slow) while the other ranks wait in no
collective of JAX's but in Ray Train's barrier or report (no timeout unless ``RAY_TRAIN_COLLECTIVE_TIMEOUT_S`` is
set: ray 2.60.0, ``ray/train/v2/_internal/constants.py``).

Without the JetStream package MaxText's engine returns its own ``ResultTokens`` stand-in
(``maxtext/common/gcloud_stub.py``, ``jetstream()``: a new class at each call; the engine's is the one its module
made at import), a plain class that a jitted function cannot return until it is
a registered JAX pytree (``jax.tree_util.register_pytree_node``); it is registered here then.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec

# Arguments the decode config replaces in the training arguments.
_REPLACED = (
    "max_prefill_predict_length=",
    "max_target_length=",
    "per_device_batch_size=",
    "load_parameters_path=",
    "decode_sampling_strategy=",
    "enable_checkpointing=",
    "run_name=",
)
INITIAL = "initial"  # a model's parameters: what training started from (the training arguments')
LATEST = "latest"  # a model's parameters: the run's newest checkpoint, the one training just saved


def per_device_batch(slots: int, devices: int) -> float:
    """The ``per_device_batch_size`` whose decode batch on ``devices`` devices is ``slots``: MaxText rounds
    ``devices`` x it down (``micro_batch_size_to_train_on``, maxtext/configs/types.py), so the smallest float whose
    product reaches ``slots``."""
    size = slots / devices
    while int(devices * size) < slots:
        size = math.nextafter(size, math.inf)
    return size


def decode_args(argv: list[str], params_path: str, prefill: int, max_new_tokens: int, batch: float) -> list[str]:
    """MaxText's arguments for decoding: the training job's (``argv``: the program name, base.yml, ``KEY=VALUE``),
    with the prefill and cache lengths, the decode slots (``batch``: :func:`per_device_batch`), greedy sampling, no
    checkpointing and the parameters' checkpoint (``params_path``, a checkpoint's ``items``; none: the parameters
    are handed to the engine)."""
    run_name = next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("run_name=")), "run")
    args = [a for a in argv if not a.startswith(_REPLACED)]
    args += [
        f"max_prefill_predict_length={prefill}",
        f"max_target_length={prefill + max_new_tokens}",
        f"per_device_batch_size={batch!r}",
        "decode_sampling_strategy=greedy",
        "enable_checkpointing=false",
        f"run_name={run_name}-answers",
    ]
    if params_path:
        args.append(f"load_parameters_path={params_path}")
    return args


def initial_params(argv: list[str]) -> Any:
    """The parameters MaxText's training starts from without a checkpoint, made by training's own program: MaxText's
    process settings as ``train.main`` makes them first (``train.initialize``: the ``unsafe_rbg`` PRNG, the TPU's
    ``--xla_tpu_spmd_rng_bit_generator_unsafe``, the partitioner), then the train state exactly as
    ``train_utils.setup_train_loop`` builds and initialises it (its ``create_train_state_fn``, then
    ``maxtext_utils.setup_training_state``: one jitted initialisation whose outputs take the train state's
    shardings) on the mesh of the training arguments ``argv`` on this group's devices; its model's ``nnx.Param``
    state, the optimizer's moments dropped. Called in the process that trains next, on the same group, before it
    trains: the same program on the same mesh with the same settings gives the same bits, however ``unsafe_rbg``
    depends on the sharding on a TPU (jax/random.py's table: not "identical across shardings" with that flag)."""
    from flax import nnx
    from maxtext.common import train_state_nnx
    from maxtext.trainers.pre_train import train
    from maxtext.utils import maxtext_utils, model_creation_utils, train_utils

    config, _ = train.initialize(argv)
    mesh = maxtext_utils.get_mesh_from_config(config)
    create_model, abstract = model_creation_utils.create_nnx_abstract_model(config, mesh)
    _, tx = train_utils.create_training_optimizer(config, abstract, mesh=mesh)
    lora = getattr(getattr(config, "lora", None), "enable_lora", False)
    wrt = getattr(nnx, "LoRAParam", nnx.Param) if lora else nnx.Param

    def create_train_state() -> Any:  # setup_train_loop's create_train_state_fn (maxtext/utils/train_utils.py)
        model = create_model()
        return train_state_nnx.TrainStateNNX(model, nnx.Optimizer(model, tx, wrt=wrt))

    state = maxtext_utils.setup_training_state(None, config, mesh, None, create_train_state)[0]
    return state["model"].filter(nnx.Param)


def _register_result_tokens() -> None:
    """MaxText's ``ResultTokens`` stand-in as a JAX pytree (once), when JetStream is absent."""
    import jax
    from maxtext.inference.maxengine import maxengine

    engine_api = maxengine.engine_api  # the class the engine's module made: each jetstream() call makes its own
    if not getattr(engine_api, "_IS_STUB", False):
        return
    cls = engine_api.ResultTokens
    if getattr(cls, "_tpupipe_pytree", False):
        return
    static = ("tokens_idx", "valid_idx", "length_idx", "samples_per_slot")
    jax.tree_util.register_pytree_node(
        cls,
        lambda r: ((r.data, r.log_prob), tuple(getattr(r, k) for k in static)),
        lambda aux, leaves: cls(data=leaves[0], log_prob=leaves[1], **dict(zip(static, aux, strict=True))),
    )
    cls._tpupipe_pytree = True


def prefill_of(prompt_ids: list[list[int]], decode: dict[str, Any]) -> int:
    """The prefill the job pads its prompts to: the bucket of the longest (``components.tpu.shapes``,
    ``prefill_length``, as the plan counts), at most ``decode``'s largest."""
    from components.tpu.shapes import prefill_length

    longest = max(len(ids) for ids in prompt_ids)
    prefill = prefill_length(longest)
    if prefill > int(decode["prefill"]):
        raise SystemExit(f"a prompt of {longest} tokens exceeds the job's largest prefill, {decode['prefill']}")
    return prefill


def answer(
    spec: RunSpec, argv: list[str], params: Any, prompt_ids: list[list[int]], pad: int, decode: dict[str, Any]
) -> list[list[int]]:
    """Every prompt's answer tokens (``eval.max_new_tokens`` each), in order, on every worker: a collective, every
    worker calls it with the same arguments. ``params``: a checkpoint's ``items`` (a path), or the parameters
    themselves (:func:`initial_params`'). ``prompt_ids``: each prompt as training's prefix
    (``trainers.data.prompt_ids``). ``decode``: the job's ``--decode`` (``components.workload.maxtext.decode_shape``):
    the largest prefill, and the decode slots of each group size; the prompts are prefilled at the bucket of the
    longest of them (``prefill_length``: at most that largest, the bucket of a prompt of ``max_target_length``), the
    same in the train and the evaluation job, which read the same prompts, so each compiles one prefill; they go in
    groups of this group's slots (the plan's count, worked out for the largest prefill, so their smaller cache fits
    with room), at most the prompts. One decode state serves every group: each slot's ``insert`` overwrites what
    the slot's next prompt reads (its prefill cache, position and token; its autoregressive part masked out:
    ``MaxEngine._insert_jit`` zeroes its segment ids), and a short last group's unused slots, still decoding the
    group before's prompts, are not read. The decode RNG is ``train.seed``'s, folded as training folds its seed
    (unused by greedy sampling, fixed all the same)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from maxtext.configs import pyconfig
    from maxtext.inference.maxengine import maxengine

    _register_result_tokens()
    path = params if isinstance(params, str) else ""
    if isinstance(params, str) and not params:
        raise ValueError("no parameters to answer with: a checkpoint's items or the parameters themselves")
    max_new_tokens, devices, prefill = spec.eval.max_new_tokens, jax.device_count(), prefill_of(prompt_ids, decode)
    if str(devices) not in decode["slots"]:
        raise SystemExit(
            f"the job's decode slots are for groups of {', '.join(decode['slots'])} devices, not {devices}"
        )
    slots = min(int(decode["slots"][str(devices)]), len(prompt_ids))
    batch = per_device_batch(slots, devices)
    config = pyconfig.initialize(decode_args(argv, path, prefill, max_new_tokens, batch))
    engine = maxengine.MaxEngine(config)
    weights = engine.load_params() if path else engine.load_params(params=params)
    rng = jax.random.fold_in(jax.random.PRNGKey(spec.train.seed), 0)
    # The group's one collective: its tokens replicated on every device, so each host reads its own copy.
    replicate = jax.jit(lambda x: x, out_shardings=engine.replicated_sharding)
    # Once: insert and generate donate it and return its successor. Traced in a jit: MaxEngine's
    # init_decode_state first makes a zero cache outside any jit (``_nnx_init_cache_dict``'s jnp.zeros), whole and
    # unsharded on the process's first device (the tensor axis's devices' shares together), and keeps it for the
    # engine's life in the closure of its jitted initialisation (``_compiled_init_cache_fn``); traced, it is never
    # allocated, and only the sharded decode state is.
    state = jax.jit(engine.init_decode_state)()
    answers: list[list[int]] = []
    for start in range(0, len(prompt_ids), slots):
        group = prompt_ids[start : start + slots]
        first = []
        for slot, ids in enumerate(group):
            padded = np.full((prefill,), pad, dtype=np.int32)
            padded[: len(ids)] = ids
            rng, use = jax.random.split(rng)
            prefix, token = engine.prefill(
                params=weights, padded_tokens=jnp.asarray(padded), true_length=len(ids), rng=use, slot=slot
            )
            state = engine.insert(prefix, state, slot=slot)
            first.append(token.data[0, 0])
        steps = []
        for _ in range(max_new_tokens - 1):
            rng, use = jax.random.split(rng)
            state, tokens = engine.generate(weights, state, rng=use)
            steps.append(tokens.data[: len(group), 0])
        made = jnp.stack([jnp.stack(first), *steps], axis=1) if steps else jnp.stack(first)[:, None]
        answers += [[int(t) for t in row] for row in np.asarray(replicate(made).addressable_data(0))]
    memory = jax.local_devices()[0].memory_stats()  # None on CPU hosts
    if memory and jax.process_index() == 0:  # what answering held at its end: the parameters and the decode state
        print(
            f"MaxText answers: {len(prompt_ids)} prompts in groups of {slots} slots, a prefill of {prefill}; "
            f"{memory.get('bytes_in_use', 0) / 1e9:.2f} GB in use on device 0 after the last group, "
            f"{memory.get('peak_bytes_in_use', 0) / 1e9:.2f} GB at the process's peak, "
            f"of {memory.get('bytes_limit', 0) / 1e9:.2f} GB",
            flush=True,
        )
    return answers


def cut(ids: list[int], longest: int, bos: int | None) -> list[int]:
    """A prompt's ids cut to its last ``longest`` tokens, its beginning token (``bos``, when it starts with it)
    kept first: a model is asked with it (``trainers.data.prompt_ids``)."""
    if len(ids) <= longest:
        return ids
    head = ids[:1] if bos is not None and ids[0] == bos else []
    return head + ids[len(ids) - longest + len(head) :]


def answer_models(
    spec: RunSpec,
    argv: list[str],
    examples: list[dict[str, Any]],
    models: list[tuple[str, str]],
    rank: int,
    decode: dict[str, Any],
) -> list[dict[str, Any]]:
    """Each model's answers to the evaluation prompts (``examples``: the held-out split's first
    ``eval.generate_examples``): ``models`` names each (``before``, ``after``, ``champion``) with its parameters
    (a checkpoint's ``items``; :data:`INITIAL`: what training starts from, ``argv``'s ``load_parameters_path`` or
    else the parameters training's own program initialises (:func:`initial_params`: asked for in the process and
    group that train next, before they train); :data:`LATEST`: the newest checkpoint under ``argv``'s
    ``base_output_directory``/``run_name``), in the shape ``decode`` gives (:func:`answer`). Every model's answers
    first, on every rank (the engine's calls are collectives); then rank 0 scores and writes them
    (``trainers.generation.record``) under ``base_output_directory``/eval, keyed as the FSDP trainer's
    (``generation.generation_key`` of MaxText's evaluation key, ``maxtext_log.eval_key``). Rank 0 emits each model's
    answering as an ``answered`` event when it ends and its scoring as the ``answers`` event's seconds, each at its own
    time, as the FSDP trainer does (the goodput ledger's evaluation, ``components/stages/goodput.py``); what it
    recorded is returned there (nothing on the other ranks)."""
    import jax
    import transformers

    from components.spec import protocol
    from trainers import committed, data, generation, maxtext_log

    arg = maxtext_log.arg
    output_dir = Path(arg(argv, "base_output_directory"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(arg(argv, "tokenizer_path"))
    keyed = maxtext_log.eval_key(argv, jax.device_count(), jax.devices()[0].platform)
    key = generation.generation_key(keyed[0] if keyed else "", spec)
    longest = int(arg(argv, "max_target_length") or 0)
    prompts = data.prompt_ids(tokenizer, [data.prompt_of(e) for e in examples])
    ids = [cut(row, longest, tokenizer.bos_token_id) if longest else row for row in prompts]
    made: list[tuple[str, list[list[int]]]] = []
    for which, params in models:
        started = time.perf_counter()
        source: Any = params
        if params == INITIAL:
            source = arg(argv, "load_parameters_path") or initial_params(argv)
        elif params == LATEST:
            newest = committed.newest_orbax(output_dir / arg(argv, "run_name") / "checkpoints", prune=False)
            if newest is None:
                raise SystemExit(f"no checkpoint of the trained model to answer with under {output_dir}")
            source = str(newest / "items")
        tokens = answer(spec, argv, source, ids, tokenizer.pad_token_id, decode)
        del source  # training's initial parameters, made here: gone before the next model or training
        made.append((which, tokens))
        if rank == 0:  # the answering's seconds, at its own time: the job's evaluation in the goodput ledger
            seconds = time.perf_counter() - started
            protocol.emit("event", {"event": "answered", "which": which, "seconds": seconds, "time": time.time()})
    if rank != 0:
        return []
    found = []
    for which, tokens in made:
        started = time.perf_counter()  # the answers event's seconds: the scoring's (the answering's were emitted)
        answers = [generation.decode(tokenizer, row) for row in tokens]
        directory = output_dir / generation.ANSWERS_DIR
        found.append(generation.record(spec, examples, answers, which, directory, key, started))
    return found
