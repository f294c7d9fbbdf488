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

The shape comes on the job's command line (``--decode``: ``components.workload.maxtext.decode_shape``, which the plan
shows and the spec checks against the chip's HBM): the prefill length, the smallest power of two >= 64 that holds a
prompt of ``max_target_length`` tokens (the bucket sizes MaxText's inference benchmarks prefill at), one for the
train and the evaluation job; and the decode slots (MaxEngine's decode batch, ``per_device_batch_size`` x the
group's devices, as decode.py's ``batch_size``) of each group size the run may have: the training batch, at most the
prompts, and no more than the KV cache's budget holds on a TPU. The prompts go in groups of that many, the last
group's empty slots left unused.

The parameters: a checkpoint's ``items`` (``load_parameters_path``: ``load_params`` reads it), or, for the model
training started from, what training started from: the training arguments' ``load_parameters_path`` when they carry
one (a base checkpoint: MaxText's training loads its parameters, ``maxtext_utils.setup_initial_state``), else the
parameters as training initialises them (:func:`initial_params`: ``init_weights_seed``'s key in training mode), handed
to ``load_params(params=...)``, which reshards them onto the engine's mesh. The engine's own initialisation would not
do: without a checkpoint, ``load_params`` builds its model in autoregressive mode, whose RNG is the seed's key itself
where training's is the seed's key folded with 0 (``maxtext_utils_nnx.create_nnx_rngs``), and it ignores its
``rng`` argument: other parameters than training's.

Every worker runs the same calls on the group's one mesh (a collective); the tokens stay on the devices until a
group ends, then meet on every device in one replicating copy (a jitted identity whose output sharding is the
engine's replicated one), which each host reads locally. Every model's tokens are made first, by every worker; then
rank 0 alone decodes, scores and records them (a team's scorer may be slow) while the other ranks wait in no
collective of JAX's but in Ray Train's report (a barrier with no timeout unless ``RAY_TRAIN_COLLECTIVE_TIMEOUT_S`` is
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


def initial_params(argv: list[str], mesh: Any) -> Any:
    """The parameters MaxText's training initialises from the training arguments ``argv`` (no checkpoint), on
    ``mesh``: the model built in training mode, whose RNG is ``init_weights_seed``'s (``create_nnx_abstract_model``
    and ``create_nnx_sharded_model``, as ``maxtext/utils/train_utils.py``'s ``setup_train_loop`` builds the model
    its train state initialises, ``maxtext_utils.setup_initial_state``); their ``nnx.Param`` state."""
    from flax import nnx
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils_nnx, model_creation_utils

    config = pyconfig.initialize(argv)
    create, abstract = model_creation_utils.create_nnx_abstract_model(config, mesh)
    model = maxtext_utils_nnx.create_nnx_sharded_model(abstract, create, mesh=mesh)
    _, params, _ = nnx.split(model, nnx.Param, ...)
    return params


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


def answer(
    spec: RunSpec, argv: list[str], params_path: str, prompt_ids: list[list[int]], pad: int, decode: dict[str, Any]
) -> list[list[int]]:
    """Every prompt's answer tokens (``eval.max_new_tokens`` each), in order, on every worker: a collective, every
    worker calls it with the same arguments. ``params_path``: a checkpoint's ``items``, or empty for the parameters
    as training initialises them (:func:`initial_params`). ``prompt_ids``: each prompt as training's prefix
    (``trainers.data.prompt_ids``), at most ``decode``'s prefill long. ``decode``: the job's ``--decode``, the
    prefill length and the decode slots of each group size (``components.workload.maxtext.decode_shape``); the
    prompts go in groups of this group's slots, at most the prompts. The decode RNG is ``train.seed``'s, folded as
    training folds its seed (unused by greedy sampling, fixed all the same)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from maxtext.configs import pyconfig
    from maxtext.inference.maxengine import maxengine

    _register_result_tokens()
    max_new_tokens, prefill, devices = spec.eval.max_new_tokens, int(decode["prefill"]), jax.device_count()
    if max(len(ids) for ids in prompt_ids) > prefill:
        raise SystemExit(f"a prompt of {max(len(ids) for ids in prompt_ids)} tokens exceeds the prefill of {prefill}")
    if str(devices) not in decode["slots"]:
        raise SystemExit(
            f"the job's decode slots are for groups of {', '.join(decode['slots'])} devices, not {devices}"
        )
    slots = min(int(decode["slots"][str(devices)]), len(prompt_ids))
    batch = per_device_batch(slots, devices)
    config = pyconfig.initialize(decode_args(argv, params_path, prefill, max_new_tokens, batch))
    engine = maxengine.MaxEngine(config)
    params = engine.load_params() if params_path else engine.load_params(params=initial_params(argv, engine.mesh))
    rng = jax.random.fold_in(jax.random.PRNGKey(spec.train.seed), 0)
    answers: list[list[int]] = []
    for start in range(0, len(prompt_ids), slots):
        group = prompt_ids[start : start + slots]
        state = engine.init_decode_state(rng=rng)
        first = []
        for slot, ids in enumerate(group):
            padded = np.full((prefill,), pad, dtype=np.int32)
            padded[: len(ids)] = ids
            rng, use = jax.random.split(rng)
            prefix, token = engine.prefill(
                params=params, padded_tokens=jnp.asarray(padded), true_length=len(ids), rng=use, slot=slot
            )
            state = engine.insert(prefix, state, slot=slot)
            first.append(token.data[0, 0])
        steps = []
        for _ in range(max_new_tokens - 1):
            rng, use = jax.random.split(rng)
            state, tokens = engine.generate(params, state, rng=use)
            steps.append(tokens.data[: len(group), 0])
        made = jnp.stack([jnp.stack(first), *steps], axis=1) if steps else jnp.stack(first)[:, None]
        # The group's one collective: its tokens replicated on every device, so each host reads its own copy.
        whole = jax.jit(lambda x: x, out_shardings=engine.replicated_sharding)(made)
        answers += [[int(t) for t in row] for row in np.asarray(whole.addressable_data(0))]
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
    (a checkpoint's ``items``; :data:`INITIAL`: what training started from, ``argv``'s ``load_parameters_path`` or
    else the parameters as training initialises them (empty); :data:`LATEST`: the newest checkpoint under ``argv``'s
    ``base_output_directory``/``run_name``), in the shape ``decode`` gives (:func:`answer`). Every model's answers
    first, on every rank (the engine's calls are collectives); then rank 0 scores and writes them
    (``trainers.generation.record``) under ``base_output_directory``/eval, keyed as the FSDP trainer's
    (``generation.generation_key`` of MaxText's evaluation key, ``maxtext_log.eval_key``), each with the seconds of
    its own answering and scoring; what it recorded is returned there (nothing on the other ranks)."""
    import jax
    import transformers

    from trainers import committed, data, generation, maxtext_log

    arg = maxtext_log.arg
    output_dir = Path(arg(argv, "base_output_directory"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(arg(argv, "tokenizer_path"))
    keyed = maxtext_log.eval_key(argv, jax.device_count(), jax.devices()[0].platform)
    key = generation.generation_key(keyed[0] if keyed else "", spec)
    longest = int(arg(argv, "max_target_length") or 0)
    prompts = data.prompt_ids(tokenizer, [data.prompt_of(e) for e in examples])
    ids = [cut(row, longest, tokenizer.bos_token_id) if longest else row for row in prompts]
    made: list[tuple[str, list[list[int]], float]] = []
    for which, params in models:
        started = time.perf_counter()
        if params == INITIAL:
            params = arg(argv, "load_parameters_path") or ""
        elif params == LATEST:
            newest = committed.newest_orbax(output_dir / arg(argv, "run_name") / "checkpoints", prune=False)
            if newest is None:
                raise SystemExit(f"no checkpoint of the trained model to answer with under {output_dir}")
            params = str(newest / "items")
        tokens = answer(spec, argv, params, ids, tokenizer.pad_token_id, decode)
        made.append((which, tokens, time.perf_counter() - started))
    if rank != 0:
        return []
    found = []
    for which, tokens, seconds in made:
        answers = [generation.decode(tokenizer, row) for row in tokens]
        directory = output_dir / generation.ANSWERS_DIR
        # its seconds: its own answering, and its scoring (record counts from ``started`` to its end)
        found.append(generation.record(spec, examples, answers, which, directory, key, time.perf_counter() - seconds))
    return found
