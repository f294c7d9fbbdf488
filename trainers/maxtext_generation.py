"""Answers to the evaluation prompts by greedy decoding with MaxText's own inference engine, in the MaxText job that
holds the model: the trained model's after training (its last checkpoint, the one the run registers), the model as
MaxText initialises it (``init_weights_seed``: the one training started from), and in the evaluation job a champion's.
Scored and written as the FSDP trainer's (``trainers.generation.record``), so the evaluate stage reads both alike
(``components.stages.answers``).

The engine is ``MaxEngine`` (maxtext 0.2.5, ``maxtext/inference/maxengine/maxengine.py``), driven as MaxText's own
``maxtext/inference/decode.py`` drives it: ``load_params`` (from ``load_parameters_path``, a checkpoint's ``items``,
or a fresh initialisation without it), then per prompt ``prefill`` into a decode slot and ``insert`` into the decode
state, then ``generate`` steps that advance every slot by one token. Its decode state is a KV cache of static shape
(slots x ``max_target_length``), and every prompt is right-padded to one prefill length (``max_prefill_predict_length``,
the smallest power of two >= 64 that holds the longest prompt: the bucket sizes MaxText's inference benchmarks
prefill at, base.yml's ``inference_microbenchmark_prefill_lengths``), with its true length a traced argument of the
jitted prefill (``_prefill_jit`` marks no length static), so on a TPU prefill, insert and generate each compile once.
Greedy: base.yml's ``decode_sampling_strategy`` default, set here explicitly.

The number of decode slots is the training batch (``per_device_batch_size`` x the group's devices: MaxEngine's
decode batch, as decode.py's ``batch_size``): the prompts go in groups of that many, the last group's empty slots
left unused. Every worker runs the same calls on the group's one mesh (a collective); the tokens stay on the devices
until a group ends, then meet on every device in one replicating copy (a jitted identity whose output sharding
is the engine's replicated one), which each host reads locally.

Without the JetStream package MaxText's engine returns its own ``ResultTokens`` stand-in
(``maxtext/common/gcloud_stub.py``, ``jetstream()``: a new class at each call; the engine's is the one its module
made at import), a plain class that a jitted function cannot return until it is
a registered JAX pytree (``jax.tree_util.register_pytree_node``); it is registered here then.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from components.spec import RunSpec

MIN_PREFILL = 64  # the smallest prefill bucket (base.yml, inference_microbenchmark_prefill_lengths)
# Arguments the decode config replaces in the training arguments.
_REPLACED = (
    "max_prefill_predict_length=",
    "max_target_length=",
    "load_parameters_path=",
    "decode_sampling_strategy=",
    "enable_checkpointing=",
    "run_name=",
)


def prefill_length(longest: int) -> int:
    """The prefill bucket of a prompt of ``longest`` tokens: the smallest power of two >= :data:`MIN_PREFILL`."""
    length = MIN_PREFILL
    while length < longest:
        length *= 2
    return length


def decode_args(argv: list[str], params_path: str, prefill: int, max_new_tokens: int) -> list[str]:
    """MaxText's arguments for decoding: the training job's (``argv``: the program name, base.yml, ``KEY=VALUE``),
    with the prefill and cache lengths, greedy sampling, no checkpointing and the parameters' checkpoint
    (``params_path``, a checkpoint's ``items``; none: the model as initialised)."""
    run_name = next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("run_name=")), "run")
    args = [a for a in argv if not a.startswith(_REPLACED)]
    args += [
        f"max_prefill_predict_length={prefill}",
        f"max_target_length={prefill + max_new_tokens}",
        "decode_sampling_strategy=greedy",
        "enable_checkpointing=false",
        f"run_name={run_name}-answers",
    ]
    if params_path:
        args.append(f"load_parameters_path={params_path}")
    return args


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


def answer(argv: list[str], params_path: str, prompt_ids: list[list[int]], max_new_tokens: int, pad: int, seed: int):
    """Every prompt's answer tokens (``max_new_tokens`` each), in order, on every worker: a collective, every worker
    calls it with the same arguments. ``prompt_ids``: each prompt as training's prefix (``trainers.data.prompt_ids``).
    ``seed``: the decode RNG's, folded as training folds its seed (unused by greedy sampling, fixed all the same)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from maxtext.configs import pyconfig
    from maxtext.inference.maxengine import maxengine

    _register_result_tokens()
    prefill = prefill_length(max(len(ids) for ids in prompt_ids))
    config = pyconfig.initialize(decode_args(argv, params_path, prefill, max_new_tokens))
    engine = maxengine.MaxEngine(config)
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
    params = engine.load_params(rng=rng)
    slots = int(config.per_device_batch_size * jax.device_count())
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


LATEST = "latest"  # a model's parameters: the run's newest checkpoint, the one training just saved


def answer_models(
    spec: RunSpec, argv: list[str], examples: list[dict[str, Any]], models: list[tuple[str, str]], rank: int
) -> list[dict[str, Any]]:
    """Each model's answers to the evaluation prompts (``examples``: the held-out split's first
    ``eval.generate_examples``), in turn: ``models`` names each (``before``, ``after``, ``champion``) with its
    parameters' checkpoint (``items``; empty: the model as initialised; :data:`LATEST`: the newest checkpoint under
    ``argv``'s ``base_output_directory``/``run_name``). Rank 0 scores and writes them (``trainers.generation.record``)
    under ``base_output_directory``/eval, keyed as the FSDP trainer's (``generation.generation_key`` of MaxText's
    evaluation key, ``maxtext_log.eval_key``); what it recorded is returned there (nothing on the other ranks)."""
    import jax
    import transformers

    from trainers import committed, data, generation, maxtext_log

    arg = maxtext_log.arg
    output_dir = Path(arg(argv, "base_output_directory"))
    tokenizer = transformers.AutoTokenizer.from_pretrained(arg(argv, "tokenizer_path"))
    keyed = maxtext_log.eval_key(argv, jax.device_count(), jax.devices()[0].platform)
    key = generation.generation_key(keyed[0] if keyed else "", spec)
    longest = int(arg(argv, "max_target_length") or 0) or None
    ids = [
        row[-longest:] if longest else row for row in data.prompt_ids(tokenizer, [data.prompt_of(e) for e in examples])
    ]
    found = []
    for which, params in models:
        started = time.perf_counter()
        if params == LATEST:
            newest = committed.newest_orbax(output_dir / arg(argv, "run_name") / "checkpoints", prune=False)
            if newest is None:
                raise SystemExit(f"no checkpoint of the trained model to answer with under {output_dir}")
            params = str(newest / "items")
        tokens = answer(argv, params, ids, spec.eval.max_new_tokens, tokenizer.pad_token_id, spec.train.seed)
        if rank == 0:
            answers = [generation.decode(tokenizer, row) for row in tokens]
            directory = output_dir / generation.ANSWERS_DIR
            found.append(generation.record(spec, examples, answers, which, directory, key, started))
    return found
